-- One bucket of stormguard's rate limit, shared by a fleet: the weighted GCRA of gcra.rs, run
-- atomically inside Redis so that one round trip decides one request for every replica.
--
-- KEYS[1]  the bucket: a hash of instants, microseconds on the Redis server's clock, kept as
--          decimal strings (a Lua number prints 14 digits; an instant has 16):
--            tr, tt  the theoretical arrival time of requests, of tokens
--            br, bt  nothing goes before this: the provider said the quota is spent
-- KEYS[2]  the replicas that used the bucket: a sorted set of ids by when they last did.
--
-- ARGV[1] is the operation:
--   reserve  id, block_r, block_t, interval_r, burst_r, interval_t, burst_t, tokens, max_wait
--            -> {'1', wait, replicas, end_r, end_t}: the slot is taken, it starts in `wait`
--            -> {'0', wait, replicas}: nothing taken, the slot would start in `wait`
--   return   interval_r, burst_r, units_r, end_r, interval_t, burst_t, units_t, end_t
--            gives back what a reservation took, for a request that was never sent
--   adjust   interval_t, units: takes (units > 0) or gives back tokens after the fact
--   block    block_r, block_t: nothing goes before now + block (0: no block)
-- Durations are microseconds, intervals microseconds per unit (0: no limit), bursts units.

local bucket, replicas = KEYS[1], KEYS[2]
local op = ARGV[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local function read(name)
  return tonumber(redis.call('HGET', bucket, name) or '0') or 0
end

local function write(name, instant)
  local text = string.format('%.3f', instant)
  redis.call('HSET', bucket, name, text)
  return text
end

-- Nothing goes in dimension `dim` for `block` microseconds (0: no block); the later block holds.
local function block_for(dim, block)
  local blocked = read('b' .. dim)
  if block > 0 and now + block > blocked then
    blocked = now + block
    write('b' .. dim, blocked)
  end
  return blocked
end

-- Keeps the bucket while it holds anything, and a minute more.
local function expire(latest)
  local ms = math.ceil(math.max(latest - now, 0) / 1000) + 60000
  redis.call('PEXPIRE', bucket, ms)
end

if op == 'reserve' then
  local max_wait = tonumber(ARGV[10])
  local latest = now
  -- One dimension: when `units` may go, and the TAT they leave (nil: nothing to take).
  local function plan(dim, block, interval, burst, units)
    local blocked = block_for(dim, block)
    latest = math.max(latest, blocked)
    if interval <= 0 or units <= 0 then
      return math.max(now, blocked), nil
    end
    local floor = 0
    if blocked > 0 then
      floor = blocked + math.max(burst - 1, 0) * interval
    end
    local tat = math.max(read('t' .. dim), floor)
    local start = math.max(now, tat - math.max(burst - units, 0) * interval)
    return start, math.max(tat, now) + units * interval
  end
  local start_r, next_r = plan('r', tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6]), 1)
  local start_t, next_t = plan('t', tonumber(ARGV[4]), tonumber(ARGV[7]), tonumber(ARGV[8]),
    tonumber(ARGV[9]))
  redis.call('ZADD', replicas, now, ARGV[2])
  redis.call('ZREMRANGEBYSCORE', replicas, '-inf', now - 30000000)
  redis.call('PEXPIRE', replicas, 60000)
  local seen = tostring(redis.call('ZCARD', replicas))
  local wait = string.format('%.0f', math.ceil(math.max(start_r, start_t) - now))
  if math.max(start_r, start_t) - now > max_wait then
    expire(latest)
    return {'0', wait, seen}
  end
  local end_r, end_t = '', ''
  if next_r then
    end_r = write('tr', next_r)
    latest = math.max(latest, next_r)
  end
  if next_t then
    end_t = write('tt', next_t)
    latest = math.max(latest, next_t)
  end
  expire(latest)
  return {'1', wait, seen, end_r, end_t}
end

if op == 'return' then
  for i, dim in ipairs({'r', 't'}) do
    local base = 2 + 4 * (i - 1)
    local interval, burst, units = tonumber(ARGV[base]), tonumber(ARGV[base + 1]),
      tonumber(ARGV[base + 2])
    local stored = redis.call('HGET', bucket, 't' .. dim)
    if stored and interval > 0 and units > 0 then
      local back = units * interval
      -- Reserved after: those keep their slots (see Gcra::give_back).
      if stored ~= ARGV[base + 3] then
        back = math.min(back, math.max(burst - 1, 0) * interval)
      end
      write('t' .. dim, math.max((tonumber(stored) or 0) - back, 0))
    end
  end
  return {}
end

if op == 'adjust' then
  local interval, units = tonumber(ARGV[2]), tonumber(ARGV[3])
  local tat = read('tt')
  if units > 0 then
    tat = math.max(tat, now) + units * interval
  else
    tat = math.max(tat + units * interval, 0)
  end
  write('tt', tat)
  expire(tat)
  return {}
end

if op == 'block' then
  local latest = math.max(block_for('r', tonumber(ARGV[2])), block_for('t', tonumber(ARGV[3])))
  expire(latest)
  return {}
end

return redis.error_reply('stormguard rate limit: unknown operation')
