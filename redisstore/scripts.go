package redisstore

import "github.com/redis/go-redis/v9"

// Record hash fields. Names are one byte to keep each record a small
// listpack (see docs/redisstore.md for the measured size).
//
//	s state (p in progress, c completed, f failed, r released)
//	t token (decimal)          f fingerprint (absent when empty)
//	r result (absent if empty) a attempts
//	e last error               l lease until (unix ms)
//	x expires at (unix ms)     c created (unix ms)
//	u updated (unix ms)        d TTL of the latest claim (ms)
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
`

// claimScript claims n keys in order. KEYS: record1, seq1, record2, seq2...
// ARGV: fp1, lease1, ttl1, fp2, ... (ms). It returns one entry per key:
// {code, s, t, f, r, a, e, l, x, c, u} with code 1 acquired, 2 completed,
// 3 in progress, 4 failed, 9 fingerprint mismatch (then only {9}).
//
// The token is max(seq+1, now in µs) where seq is the shard's counter: the
// counter keeps tokens growing when the clock steps back, the clock keeps
// them growing when the counter is lost (flush, failover that lost the last
// writes). The counter is written before the record so that a write refused
// half way (OOM) can only waste a token, never reuse one.
var claimScript = redis.NewScript(luaPrelude + `
local out = {}
for i = 1, #KEYS / 2 do
  local rk, sk = KEYS[2*i-1], KEYS[2*i]
  local fp, lease, ttl = ARGV[3*i-2], tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  local h = redis.call('HMGET', rk, 's', 't', 'f', 'r', 'a', 'e', 'l', 'x', 'c', 'u')
  local s = h[1]
  local code = 1
  if s then
    if fp ~= '' and h[3] and h[3] ~= '' and h[3] ~= fp then code = 9
    elseif s == 'c' then code = 2
    elseif s == 'f' then code = 4
    elseif s == 'p' and tonumber(h[7]) > nowms then code = 3
    end
  end
  if code == 9 then
    out[i] = {9}
  elseif code ~= 1 then
    out[i] = {code, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10]}
  else
    local c = tonumber(redis.call('GET', sk) or '0')
    if c < nowus then c = nowus else c = c + 1 end
    local tok = S(c)
    redis.call('SET', sk, tok)
    local lu = nowms + lease
    local ex = math.max(nowms + ttl, lu)
    local att, cr, f = 1, S(nowms), h[3]
    if s then
      att = tonumber(h[5]) + 1
      cr = h[9]
    end
    if (not f or f == '') and fp ~= '' then
      f = fp
      redis.call('HSET', rk, 'f', fp)
    end
    redis.call('HSET', rk, 's', 'p', 't', tok, 'a', S(att), 'l', S(lu), 'x', S(ex), 'c', cr, 'u', S(nowms), 'd', S(ttl))
    redis.call('PEXPIREAT', rk, S(ex))
    out[i] = {1, 'p', tok, f, false, S(att), h[6], S(lu), S(ex), cr, S(nowms)}
  end
end
return out
`)

// updateScript applies Complete (c), Release (r), Fail (f) or Extend (e)
// with a token. KEYS: record. ARGV: op, token, arg (result, cause or lease
// ms). Returns 1 done, 0 not found, -1 fenced.
var updateScript = redis.NewScript(luaPrelude + `
local rk, op, tok, arg = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local h = redis.call('HMGET', rk, 's', 't', 'x', 'd')
local s = h[1]
if not s then return 0 end
if h[2] ~= tok then return -1 end
if s == op then
  if op == 'c' or op == 'r' or op == 'f' then return 1 end
end
if s ~= 'p' then return -1 end
local ex = tonumber(h[3])
if op == 'c' then
  ex = nowms + tonumber(h[4])
  if arg ~= '' then redis.call('HSET', rk, 'r', arg) end
  redis.call('HSET', rk, 's', 'c', 'u', S(nowms), 'x', S(ex))
elseif op == 'r' then
  if arg ~= '' then redis.call('HSET', rk, 'e', arg) end
  redis.call('HSET', rk, 's', 'r', 'u', S(nowms))
elseif op == 'f' then
  ex = nowms + tonumber(h[4])
  redis.call('HSET', rk, 's', 'f', 'e', arg, 'u', S(nowms), 'x', S(ex))
elseif op == 'e' then
  local lu = nowms + tonumber(arg)
  if lu > ex then ex = lu end
  redis.call('HSET', rk, 'l', S(lu), 'u', S(nowms), 'x', S(ex))
else
  return redis.error_reply('idem: unknown op ' .. op)
end
redis.call('PEXPIREAT', rk, S(ex))
return 1
`)

// recordFields is the HMGET order shared by claimScript's replies and Get.
var recordFields = []string{"s", "t", "f", "r", "a", "e", "l", "x", "c", "u"}
