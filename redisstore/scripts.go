package redisstore

import "github.com/redis/go-redis/v9"

// A record is one string key (see docs/redisstore.md for why not a hash):
//
//	1|s|token|attempts|lease|expires|created|updated|ttl|len(f)|len(e)|<f><e><r>
//
// 1 is the format version; s is p (in progress), c (completed), f (failed)
// or r (released); times are unix ms; ttl is the latest claim's TTL in ms
// (Complete and Fail need it); f, e and r are the fingerprint, last error
// and result as raw bytes, the first two length-prefixed, the result taking
// the rest. Every write sets it with PXAT expires, so Redis drops it at
// ExpiresAt.
//
// Every script reads the time with TIME so that all workers share the
// server's clock, and formats numbers with %.0f: Redis converts Lua numbers
// with limited precision, and tokens need all 16 digits.

// luaPrelude is shared by every script.
const luaPrelude = `
local tm = redis.call('TIME')
local nowms = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local nowus = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local function S(v) return string.format('%.0f', v) end
local nowmsS, nowusS = S(nowms), S(nowus)
local function parse(v)
  local ver, s, t, a, l, x, c, u, d, fl, el, p = string.match(v,
    '^(%d)|(%a)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|()')
  if ver ~= '1' then return nil end
  fl, el = tonumber(fl), tonumber(el)
  return {s = s, t = t, a = a, l = tonumber(l), x = tonumber(x), c = c, d = d,
    f = string.sub(v, p, p + fl - 1), e = string.sub(v, p + fl, p + fl + el - 1), rp = p + fl + el}
end
local function pack(s, t, a, l, x, c, u, d, f, e, r)
  return '1|' .. s .. '|' .. t .. '|' .. a .. '|' .. l .. '|' .. x .. '|' .. c .. '|' .. u .. '|' .. d ..
    '|' .. tostring(#f) .. '|' .. tostring(#e) .. '|' .. f .. e .. r
end
local function corrupt(k) return redis.error_reply('idem: corrupt record at ' .. k) end
`

// claimScript claims n keys in order. KEYS: record1, seq1, record2, seq2...
// ARGV: fp1, lease1, ttl1, fp2, ... (ms). It returns one entry per key:
// {code, record} with code 1 acquired, 2 completed, 3 in progress, 4
// failed, 9 fingerprint mismatch (then only {9}).
//
// The token is max(seq+1, now in µs) where seq is the shard's counter (one
// SET ... GET in the usual case, a second SET when the clock has not passed
// the counter): the counter keeps tokens growing when the clock steps back,
// the clock keeps them growing when the counter is lost (flush, failover
// that lost the last writes). The counter is written before the record so
// that a write refused half way (OOM) can only waste a token, never reuse
// one.
var claimScript = redis.NewScript(luaPrelude + `
local out = {}
for i = 1, #KEYS / 2 do
  local rk, sk = KEYS[2*i-1], KEYS[2*i]
  local fp = ARGV[3*i-2]
  local v = redis.call('GET', rk)
  local code, h = 1, nil
  if v then
    h = parse(v)
    if not h then return corrupt(rk) end
    if fp ~= '' and h.f ~= '' and h.f ~= fp then code = 9
    elseif h.s == 'c' then code = 2
    elseif h.s == 'f' then code = 4
    elseif h.s == 'p' and h.l > nowms then code = 3
    end
  end
  if code == 9 then
    out[i] = {9}
  elseif code ~= 1 then
    out[i] = {code, v}
  else
    -- Usual case: one SET ... GET. The rare second SET (same µs, or the
    -- clock behind the counter) follows at once in the same script.
    local tok = nowusS
    local old = redis.call('SET', sk, tok, 'GET')
    if old and tonumber(old) >= nowus then
      tok = S(tonumber(old) + 1)
      redis.call('SET', sk, tok)
    end
    local ttlS = ARGV[3*i]
    local lu = nowms + tonumber(ARGV[3*i-1])
    local ex = nowms + tonumber(ttlS)
    local luS = S(lu)
    local exS = luS
    if ex > lu then exS = S(ex) end
    local att, cr, f, e = '1', nowmsS, fp, ''
    if h then
      att, cr, e = S(tonumber(h.a) + 1), h.c, h.e
      if h.f ~= '' then f = h.f end
    end
    v = pack('p', tok, att, luS, exS, cr, nowmsS, ttlS, f, e, '')
    redis.call('SET', rk, v, 'PXAT', exS)
    out[i] = {1, v}
  end
end
return out
`)

// luaUpdate defines update(rk, op, tok, arg), the one implementation of
// Complete (c), Release (r), Fail (f) and Extend (e) with a token: arg is
// the result, cause or lease ms. It returns 1 done, 0 not found, -1 fenced,
// -2 corrupt record, -3 unknown op. updateScript runs it once,
// completeBatchScript once per entry.
const luaUpdate = `
local function update(rk, op, tok, arg)
  local v = redis.call('GET', rk)
  if not v then return 0 end
  local h = parse(v)
  if not h then return -2 end
  if h.t ~= tok then return -1 end
  if h.s == op and (op == 'c' or op == 'r' or op == 'f') then return 1 end
  if h.s ~= 'p' then return -1 end
  local ex, l, e = h.x, h.l, h.e
  local s = op
  if op == 'c' then
    ex = nowms + tonumber(h.d)
  elseif op == 'r' then
    if arg ~= '' then e = arg end
  elseif op == 'f' then
    ex = nowms + tonumber(h.d)
    e = arg
  elseif op == 'e' then
    s = 'p'
    l = nowms + tonumber(arg)
    if l > ex then ex = l end
  else
    return -3
  end
  local r = ''
  if op == 'c' then r = arg end
  redis.call('SET', rk, pack(s, h.t, h.a, S(l), S(ex), h.c, S(nowms), h.d, h.f, e, r), 'PXAT', S(ex))
  return 1
end
`

// updateScript applies one op. KEYS: record. ARGV: op, token, arg.
// Returns update's code; a corrupt record or unknown op is an error reply.
var updateScript = redis.NewScript(luaPrelude + luaUpdate + `
local n = update(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if n == -2 then return corrupt(KEYS[1]) end
if n == -3 then return redis.error_reply('idem: unknown op ' .. ARGV[1]) end
return n
`)

// completeBatchScript completes n records, each independently, in order.
// KEYS: record1, record2... ARGV: token1, result1, token2, result2...
// Returns one update code per key (a corrupt record is -2 for its entry
// only, so the other entries are still settled and reported).
var completeBatchScript = redis.NewScript(luaPrelude + luaUpdate + `
local out = {}
for i = 1, #KEYS do
  out[i] = update(KEYS[i], 'c', ARGV[2*i-1], ARGV[2*i])
end
return out
`)
