package streamsbroker

import "github.com/idem-dev/idem/internal/redisx/script"

// Every script touches one stream and keys in its hash slot only (see
// slotPrefix), so each runs on a Redis Cluster as on a single node. They
// are sent once (package script): a lost reply is an error, never a second
// run behind the caller's back.

// publishScript adds one entry. KEYS[1] stream, KEYS[2] (with dedup) the
// message id's dedup key. ARGV[1] dedup window in ms (0: none), ARGV[2]
// MaxLen (0: none), ARGV[3...] the entry's fields. With dedup, a message id
// published within the window returns the first entry's id (second
// element 1) and adds nothing. With MaxLen, a stream already holding that
// many entries refuses with IDEMFULL: nothing is ever trimmed to make room.
var publishScript = script.New(`
local window = tonumber(ARGV[1])
if window > 0 then
  local prev = redis.call('GET', KEYS[2])
  if prev then return {prev, 1} end
end
local maxlen = tonumber(ARGV[2])
if maxlen > 0 then
  local n = redis.call('XLEN', KEYS[1])
  if n >= maxlen then
    return redis.error_reply('IDEMFULL stream holds ' .. n .. ' entries, MaxLen is ' .. maxlen)
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
if window > 0 then redis.call('SET', KEYS[2], id, 'PX', window) end
return {id, 0}
`)

// reclaimScript redelivers entries idle past the ack wait to this
// consumer. KEYS[1] stream, KEYS[2] its dead-letter stream. ARGV group,
// consumer, min idle ms, XAUTOCLAIM cursor, count, max deliveries (0: no
// limit). XAUTOCLAIM takes the entries (and counts one more delivery of
// each); XPENDING reads each one's delivery count. An entry past the limit
// is not delivered: it is copied to the dead-letter stream with the reason
// and acked, in this one script, so it is dead-lettered exactly once.
// Returns {next cursor, {{id, deliveries, fields}...}, {dead-lettered
// ids}, {ids of pending entries no longer in the stream}}.
var reclaimScript = script.New(`
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local max = tonumber(ARGV[6])
local out, dead, gone = {}, {}, {}
for _, e in ipairs(r[2]) do
  local id, fields = e[1], e[2]
  if not fields then
    redis.call('XACK', KEYS[1], ARGV[1], id)
    table.insert(gone, id)
  else
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
    local n = 1
    if p[1] then n = p[1][4] end
    if max > 0 and n > max then
      table.insert(fields, 'idem-dead-letter-reason')
      table.insert(fields, 'delivery limit: ' .. (n - 1) .. ' deliveries (MaxDeliver ' .. max .. ') left unsettled')
      table.insert(fields, 'idem-dead-letter-stream')
      table.insert(fields, KEYS[1])
      table.insert(fields, 'idem-dead-letter-entry')
      table.insert(fields, id)
      redis.call('XADD', KEYS[2], '*', unpack(fields))
      redis.call('XACK', KEYS[1], ARGV[1], id)
      table.insert(dead, id)
    else
      table.insert(out, {id, n, fields})
    end
  end
end
if r[3] then
  for _, id in ipairs(r[3]) do table.insert(gone, id) end
end
return {r[1], out, dead, gone}
`)

// touchScript acts on one delivery only while it is still this
// consumer's, at the same delivery count (an entry reclaimed by another
// consumer, or by this one as a new delivery, is left alone). KEYS[1]
// stream. ARGV group, consumer, entry id, delivery count, idle ms (-1:
// now). XCLAIM ... JUSTID keeps the delivery count and sets the idle time:
// 0 for InProgress (the ack wait starts again), AckWait - delay for a Nak
// (the entry is reclaimable once delay has passed). Returns 1 when done,
// 0 when the delivery is no longer ours.
var touchScript = script.New(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
local e = p[1]
if not e or e[2] ~= ARGV[2] or e[4] ~= tonumber(ARGV[4]) then return 0 end
if ARGV[5] == '-1' then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
else
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[5], 'JUSTID')
end
return 1
`)

// termScript acks an entry and, if it was pending (the first settle of
// it), copies it to the dead-letter stream with the reason. KEYS[1]
// stream, KEYS[2] dead-letter stream. ARGV group, entry id, reason.
var termScript = script.New(`
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked == 1 then
  local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
  if e[1] then
    local fields = e[1][2]
    table.insert(fields, 'idem-dead-letter-reason')
    table.insert(fields, ARGV[3])
    table.insert(fields, 'idem-dead-letter-stream')
    table.insert(fields, KEYS[1])
    table.insert(fields, 'idem-dead-letter-entry')
    table.insert(fields, ARGV[2])
    redis.call('XADD', KEYS[2], '*', unpack(fields))
  end
end
return acked
`)

// trimScript removes the entries every consumer group is done with, and
// consumers that hold nothing and have not been seen for a while. KEYS[1]
// stream. ARGV consumer expiry ms. For each group the first entry it still
// needs is its oldest pending entry, or, with none pending, the one after
// its last delivered entry; the stream is trimmed (XTRIM MINID, exact) to
// the smallest of those, so no entry a group has not acked, or not yet
// read, is ever removed. A stream without groups is left alone (nobody has
// read anything). Returns {entries trimmed, MINID used ("" if none),
// consumers deleted}.
var trimScript = script.New(`
local function less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
local function hash(flat)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h
end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
local min = nil
local deleted = 0
local expiry = tonumber(ARGV[1])
for _, flat in ipairs(groups) do
  local g = hash(flat)
  local need = g['last-delivered-id']
  if g['pending'] > 0 then
    need = redis.call('XPENDING', KEYS[1], g['name'])[2]
  end
  if min == nil or less(need, min) then min = need end
  for _, cflat in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], g['name'])) do
    local c = hash(cflat)
    if c['pending'] == 0 and c['idle'] > expiry then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], g['name'], c['name'])
      deleted = deleted + 1
    end
  end
end
if min == nil then return {0, '', deleted} end
local n = redis.call('XTRIM', KEYS[1], 'MINID', '=', min)
return {n, min, deleted}
`)

// handBackScript makes every entry pending for this consumer reclaimable
// by the group at once (idle = the ack wait), then deletes the consumer if
// it holds nothing (the common case: a subscriber closed after settling
// everything). KEYS[1] stream. ARGV group, consumer, idle ms. Returns the
// number of entries handed back.
var handBackScript = script.New(`
local n = 0
local start = '-'
while true do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], start, '+', 1000, ARGV[2])
  if #p == 0 then break end
  local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
  for _, e in ipairs(p) do table.insert(args, e[1]) end
  table.insert(args, 'IDLE')
  table.insert(args, ARGV[3])
  table.insert(args, 'JUSTID')
  redis.call(unpack(args))
  n = n + #p
  start = '(' .. p[#p][1]
end
if n == 0 then redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2]) end
return n
`)
