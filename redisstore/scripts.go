package redisstore

import "github.com/idem-dev/idem/internal/redisx/script"

// A record is one string key (see docs/redisstore.md for why not a hash):
//
//	3|s|token|attempts|lb|xb|created|updated|ld|xd|ttl|len(f)|len(e)|<f><e><r>
//
// 3 is the format version; s is p (in progress), c (completed), f (failed)
// or r (released); times are unix ms and durations ms: the lease ends at
// lb+ld and the record expires at xb+xd (Redis drops the key then: every
// write sets PX xd, or KEEPTTL when the expiry does not move); ttl is the
// latest claim's TTL (Complete and Fail need it); f, e and r are the
// fingerprint, last error and result as raw bytes, the first two
// length-prefixed, the result taking the rest.
//
// Why sums instead of absolute times: every script reads the time with
// TIME so that all workers share the server's clock, and in Redis' Lua
// turning a number into a string (sprintf) costs about as much as a whole
// SET. Stored as (base, duration) pairs, a claim or a completion writes
// only strings it already has: TIME's digits and the durations the client
// sent. Numbers are formatted only on rare paths (a takeover's attempt
// count, a token bumped past the counter), with %.0f: tokens need all 16
// digits.
//
// Why this field order (version 3; version 2, still read, had
// lb|ld|xb|xd|created|updated): a new record is the same for every key of
// a script up to "updated|" (token and times are the script's), and the
// rest, "ld|xd|ttl|len(f)|0|<f>", is the client's. So the client sends
// that tail ready-made and a claim of a new key is one concatenation and
// one SET NX GET, and the reply carries no record for it: the client
// knows every field. This cut the server's time per claim in a batch by
// about a quarter (measured, docs/benchmarks/redisstore.md).
//
// Tokens are microseconds of server time, made to grow past a counter:
// token = max(counter+1, now in µs). The counter keeps tokens growing when
// the clock steps back, the clock keeps them growing when the counter is
// lost (flush, failover that lost the last writes). One script reads and
// writes the counter once, before any record (a write refused half way,
// OOM, can only waste a token, never reuse one), and every key it claims
// gets that token: tokens must grow per key, not be unique across keys. A
// key claimed twice in one script (or whose record holds a larger token)
// gets a larger token, written to the counter first. On a single node the
// namespace has one counter; on a cluster each shard ({shard} hash tag) has
// its own, in its records' slot, and a script only ever holds one shard's
// keys.

// luaPrelude is shared by every script: the time as numbers and as digit
// strings, and the record parser. parse returns nil for anything that is
// not a version 2 or 3 record (unknown state, lengths past the end, or a
// token of more than 16 digits, which a takeover would carry into the
// counter). parseRecord in Go accepts exactly the same values
// (TestScriptAndDecoderAgree).
const luaPrelude = `
local tm = redis.call('TIME')
local us6 = string.sub('00000' .. tm[2], -6)
local nowusS, nowmsS = tm[1] .. us6, tm[1] .. string.sub(us6, 1, 3)
local nowus, nowms = tonumber(nowusS), tonumber(nowmsS)
local function S(v) return string.format('%.0f', v) end
local function parse(v)
  local ver, s, t, a, f4, f5, f6, f7, f8, f9, d, fl, el, p = string.match(v,
    '^(%d)|(%a)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|()')
  local lb, xb, c, ld, xd
  if ver == '3' then
    lb, xb, c, ld, xd = f4, f5, f6, f8, f9
  elseif ver == '2' then
    lb, ld, xb, xd, c = f4, f5, f6, f7, f8
  else
    return nil
  end
  local fn, en = tonumber(fl), tonumber(el)
  if p + fn + en - 1 > #v or #t > 16 or not string.find('pcfr', s, 1, true) then return nil end
  return {s = s, t = t, a = a, lb = lb, ld = ld, xb = xb, xd = xd, c = c, d = d, fl = fl, el = el,
    f = string.sub(v, p, p + fn - 1), e = string.sub(v, p + fn, p + fn + en - 1)}
end
`

// claimScript claims n keys in order. KEYS: counter, record1, record2...
// ARGV per key: tail, px, where tail is "ld|xd|ttl|len(fp)|0|<fp>" (the
// end of a new record, see above) and px = xd = max(lease, ttl) in ms.
//
// It returns {token, now ms, then i, code, record for every key i
// that did not get a new record with that token, i counting from 0}; a key not listed was
// acquired fresh: the client builds its record from the token, the time and
// its own request. Codes: 1 acquired (a takeover), 2 completed, 3 in
// progress, 4 failed, 9 fingerprint mismatch (record then empty), 8 the
// key holds no record of ours (record then the Redis error, if any), 7 bad
// arguments.
//
// The usual path for a key is one SET NX GET: it writes the new record and
// tells in the same call whether one was there.
//
// No key's trouble stops the script: a script that fails half way keeps
// the writes it made (Redis has no rollback), which would leave the keys
// before the bad one in progress, held by nobody, and fail every caller
// sharing the script. So every write is the key's own check-and-write or
// follows a check of that key alone: SET NX GET writes nothing when a value
// is there, and is called with pcall because on a key of another type it
// fails (WRONGTYPE) without writing; a value that is not a record is
// reported (code 8) and left alone. The counter is read and written
// first, before any record, so an error there (a counter of another type)
// fails the script before it wrote anything.
var claimScript = script.New(luaPrelude + `
local tok = nowusS
local old = redis.call('SET', KEYS[1], tok, 'GET')
local top = nowus
if old then
  local o = tonumber(old)
  if o and o >= nowus then
    top = o + 1
    tok = S(top)
    redis.call('SET', KEYS[1], tok)
  end
end
local pre = '3|p|' .. tok .. '|1|' .. nowmsS .. '|' .. nowmsS .. '|' .. nowmsS .. '|' .. nowmsS .. '|'
local out = {tok, nowmsS}
local n = 2
for i = 2, #KEYS do
  local rk, tail, px = KEYS[i], ARGV[2*i-3], ARGV[2*i-2]
  local cur = redis.pcall('SET', rk, pre .. tail, 'NX', 'GET', 'PX', px)
  if cur then
    local code, rec = 8, ''
    local h = type(cur) == 'string' and parse(cur)
    local lease, _, ttl, fl, fpos = string.match(tail, '^(%d+)|(%d+)|(%d+)|(%d+)|0|()')
    if not h then
      if type(cur) == 'table' then rec = tostring(cur.err) end
    elseif not fpos then
      code = 7
    else
      local fp = string.sub(tail, fpos)
      code, rec = 1, cur
      if fp ~= '' and h.f ~= '' and h.f ~= fp then
        code, rec = 9, ''
      elseif h.s == 'c' then
        code = 2
      elseif h.s == 'f' then
        code = 4
      elseif h.s == 'p' and tonumber(h.lb) + tonumber(h.ld) > nowms then
        code = 3
      else
        -- Takeover: released, or its lease ran out.
        local t = tok
        local ht = tonumber(h.t)
        if ht >= tonumber(t) then
          if ht >= top then top = ht end
          top = top + 1
          t = S(top)
          redis.call('SET', KEYS[1], t)
        end
        local f, flen = h.f, h.fl
        if f == '' then f, flen = fp, fl end
        rec = '3|p|' .. t .. '|' .. S(tonumber(h.a) + 1) .. '|' .. nowmsS .. '|' .. nowmsS .. '|' .. h.c .. '|' ..
          nowmsS .. '|' .. lease .. '|' .. px .. '|' .. ttl .. '|' .. flen .. '|' .. h.el .. '|' .. f .. h.e
        redis.call('SET', rk, rec, 'PX', px)
      end
    end
    out[n+1], out[n+2], out[n+3] = i - 2, code, rec
    n = n + 3
  end
end
return out
`)

// luaUpdate defines update(rk, op, tok, arg, alen), the one implementation
// of Complete (c), Release (r), Fail (f) and Extend (e) with a token: arg is
// the result, cause or lease ms, alen the cause's length (the client sends
// it: see the record format above). It returns 1 done, 0 not found, -1
// fenced, -2 not a record of ours (nothing written), -3 unknown op. updateScript runs it once,
// completeBatchScript and extendBatchScript once per entry.
const luaUpdate = `
local function update(rk, op, tok, arg, alen)
  local v = redis.pcall('GET', rk)
  if not v then return 0 end
  if type(v) == 'table' then return -2 end
  local h = parse(v)
  if not h then return -2 end
  if h.t ~= tok then return -1 end
  if h.s == op and (op == 'c' or op == 'r' or op == 'f') then return 1 end
  if h.s ~= 'p' then return -1 end
  local s, lb, ld, xb, xd, e, el, r, px = op, h.lb, h.ld, h.xb, h.xd, h.e, h.el, '', nil
  if op == 'c' then
    xb, xd, r, px = nowmsS, h.d, arg, h.d
  elseif op == 'r' then
    if arg ~= '' then e, el = arg, alen end
  elseif op == 'f' then
    xb, xd, e, el, px = nowmsS, h.d, arg, alen, h.d
  elseif op == 'e' then
    s, lb, ld = 'p', nowmsS, arg
    if nowms + tonumber(arg) > tonumber(xb) + tonumber(xd) then xb, xd, px = nowmsS, arg, arg end
  else
    return -3
  end
  v = '3|' .. s .. '|' .. h.t .. '|' .. h.a .. '|' .. lb .. '|' .. xb .. '|' .. h.c .. '|' .. nowmsS .. '|' ..
    ld .. '|' .. xd .. '|' .. h.d .. '|' .. h.fl .. '|' .. el .. '|' .. h.f .. e .. r
  if px then
    redis.call('SET', rk, v, 'PX', px)
  else
    redis.call('SET', rk, v, 'KEEPTTL')
  end
  return 1
end
`

// updateScript applies one op. KEYS: record. ARGV: op, token, arg, alen.
// Returns update's code; an unknown op is an error reply.
var updateScript = script.New(luaPrelude + luaUpdate + `
local n = update(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if n == -3 then return redis.error_reply('idem: unknown op ' .. ARGV[1]) end
return n
`)

// completeBatchScript completes n records, each independently, in order.
// KEYS: record1, record2... ARGV: token1, result1, token2, result2...
// Returns one update code per key (a corrupt record or a key of another
// type is -2 for its entry only, so the other entries are still settled and
// reported: GET is called with pcall, WRONGTYPE must not stop the script
// after earlier entries were written).
var completeBatchScript = script.New(luaPrelude + luaUpdate + `
local out = {}
for i = 1, #KEYS do
  out[i] = update(KEYS[i], 'c', ARGV[2*i-1], ARGV[2*i], '')
end
return out
`)

// extendBatchScript extends n leases, each independently, in order, as
// completeBatchScript completes. KEYS: record1, record2... ARGV: token1,
// lease ms1, token2, lease ms2... Returns one update code per key.
var extendBatchScript = script.New(luaPrelude + luaUpdate + `
local out = {}
for i = 1, #KEYS do
  out[i] = update(KEYS[i], 'e', ARGV[2*i-1], ARGV[2*i], 0)
end
return out
`)
