-- The cooldowns a fleet's failovers share: a backend whose breaker opened on one replica is
-- left by every replica until its breaker would let a probe through. Times are milliseconds on
-- the Redis server's clock, so that the replicas' own clocks never have to agree.
--
-- KEYS[1]  a hash: backend name -> the instant its cooldown ends.
--
-- ARGV[1] is the operation:
--   set   name, wait_ms  -> {}: the backend cools down for wait_ms from now (never shortening
--                           one already longer)
--   get                  -> {name, left_ms, ...}: every backend still cooling down, and for how
--                           much longer; the ended ones are removed
-- The hash expires a minute after its last write, so that a fleet gone quiet leaves nothing.

local cooldowns = KEYS[1]
local op = ARGV[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

if op == 'set' then
  local name, wait = ARGV[2], tonumber(ARGV[3]) or 0
  local until_ = now + math.max(0, math.min(wait, 3600000))
  local known = tonumber(redis.call('HGET', cooldowns, name) or '0') or 0
  if until_ > known then
    redis.call('HSET', cooldowns, name, string.format('%d', until_))
  end
  redis.call('PEXPIRE', cooldowns, 60000)
  return {}
end

local reply = {}
local all = redis.call('HGETALL', cooldowns)
for i = 1, #all, 2 do
  local left = (tonumber(all[i + 1]) or 0) - now
  if left > 0 then
    reply[#reply + 1] = all[i]
    reply[#reply + 1] = string.format('%d', left)
  else
    redis.call('HDEL', cooldowns, all[i])
  end
end
return reply
