-- slurm-gpushare: the client side of the filter service protocol, shared by job_submit.lua
-- (inside slurmctld) and cli_filter.lua (inside srun). Lua 5.1, lua-socket.
--
-- Protocol 2 (slurm_gpushare/submit/protocol.py): each message is a header line "GPS2 <id> <length>"
-- and then <length> bytes of JSON; the answer carries the id of its request, and an answer with any
-- other id is never used (the connection is dropped and the fail policy applies). The connection is
-- kept open between calls (the Lua state survives between submissions).

local M = {}

M.settings = {
  -- public unix socket of `slurm-gpushare filterd` (its --socket): cli_filter.lua, as the user
  socket = "/run/slurm-gpushare/filterd/filterd.sock",
  -- private unix socket of filterd (its --controller-socket, mode 0600, SlurmUser and root only):
  -- job_submit.lua in slurmctld, where no user can fill the backlog; nil or "": job_submit.lua uses `socket`
  controller_socket = "/run/slurm-gpushare/filterd/controller.sock",
  -- seconds to wait for one answer (a decision takes well under 1 ms); a dead service (no socket,
  -- refused) fails at once. slurmctld runs job_submit.lua one job at a time: a hung service costs at
  -- most this per GPU-share job, and jobs that mention no gpushare/shard/mps never wait at all.
  timeout = 0.02,
  -- after a timeout, seconds during which the service is not asked again (the fail policy applies at
  -- once), so that a hung service costs one timeout per this many seconds, not one per job
  backoff = 5.0,
  -- what happens to jobs that need the service while it cannot answer:
  --   "reject":       they are refused with a message saying what to do (the default)
  --   "allow-direct": direct shard:/mps: requests pass unpoliced; gpushare: requests are still refused
  -- A raw gpushare: request never reaches Slurm's scheduler either way.
  fail_policy = "reject",
}

local unix_ok, unix = pcall(require, "socket.unix")
local clock_ok, clock = pcall(require, "socket")
local conn = nil
local last_id = 0
local quiet_until = 0  -- no request before this time (socket.gettime()): the service did not answer

M.PROTOCOL = 2
M.MAGIC = "GPS2"
-- longest answer body accepted (bytes)
M.MAX_ANSWER = 1048576

local function now()
  if clock_ok then return clock.gettime() end
  return os.time()
end

-- Does any of the strings mention a GPU-share GRES (the only requests that cost a round trip)?
function M.mentions_share(...)
  for i = 1, select("#", ...) do
    local s = select(i, ...)
    if type(s) == "string" and (string.find(s, "gpushare", 1, true) or string.find(s, "shard", 1, true)
        or string.find(s, "mps", 1, true)) then
      return true
    end
  end
  return false
end

function M.mentions_gpushare(...)
  for i = 1, select("#", ...) do
    local s = select(i, ...)
    if type(s) == "string" and string.find(s, "gpushare", 1, true) then return true end
  end
  return false
end

local function jstr(s)
  s = tostring(s or "")
  s = string.gsub(s, '[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return string.format("\\u%04x", string.byte(c))
  end)
  return '"' .. s .. '"'
end

-- Encode a flat table of strings and numbers as one JSON object (keys sorted: stable lines).
function M.encode(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = t[k]
    if type(v) == "number" then v = tostring(v) else v = jstr(v) end
    parts[#parts + 1] = jstr(k) .. ":" .. v
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

local ESC = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
                     0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- Decode one flat JSON object whose values are strings, numbers, booleans or null.
-- Returns a table, or nil and a reason.
function M.decode(s)
  local i, n = 1, #s
  local function ws() i = string.find(s, "[^ \t\r\n]", i) or n + 1 end
  local function str()
    if string.sub(s, i, i) ~= '"' then return nil end
    i = i + 1
    local out = {}
    while i <= n do
      -- copy the run up to the next quote or backslash in one piece (answers are mostly plain text)
      local j = string.find(s, '["\\]', i)
      if not j then return nil end
      if j > i then out[#out + 1] = string.sub(s, i, j - 1) end
      i = j
      if string.sub(s, i, i) == '"' then i = i + 1; return table.concat(out) end
      local e = string.sub(s, i + 1, i + 1)
      if e == "u" then
        local cp = tonumber(string.sub(s, i + 2, i + 5), 16)
        if not cp then return nil end
        i = i + 6
        -- a character beyond U+FFFF comes as a surrogate pair (Python's json escapes it so): one character
        if cp >= 0xD800 and cp < 0xDC00 and string.sub(s, i, i + 1) == "\\u" then
          local lo = tonumber(string.sub(s, i + 2, i + 5), 16)
          if lo and lo >= 0xDC00 and lo < 0xE000 then
            cp = 0x10000 + (cp - 0xD800) * 1024 + (lo - 0xDC00); i = i + 6
          end
        end
        out[#out + 1] = utf8(cp)
      elseif ESC[e] then
        out[#out + 1] = ESC[e]; i = i + 2
      else
        return nil
      end
    end
    return nil
  end
  local t = {}
  ws()
  if string.sub(s, i, i) ~= "{" then return nil, "not an object" end
  i = i + 1; ws()
  if string.sub(s, i, i) == "}" then return t end
  while true do
    ws()
    local k = str()
    if not k then return nil, "bad key at " .. i end
    ws()
    if string.sub(s, i, i) ~= ":" then return nil, "missing : at " .. i end
    i = i + 1; ws()
    local c = string.sub(s, i, i)
    local v
    if c == '"' then
      v = str()
      if v == nil then return nil, "bad string at " .. i end
    else
      local lit = string.match(s, "^[%w%.%+%-]+", i)
      if not lit then return nil, "bad value at " .. i end
      i = i + #lit
      if lit == "true" then v = true elseif lit == "false" then v = false elseif lit == "null" then v = nil
      else v = tonumber(lit); if v == nil then return nil, "bad number " .. lit end end
    end
    t[k] = v
    ws()
    c = string.sub(s, i, i)
    i = i + 1
    if c == "}" then return t end
    if c ~= "," then return nil, "expected , or } at " .. (i - 1) end
  end
end

local function drop()
  if conn then conn:close() end
  conn = nil
end

-- Close the kept connection (job_submit.lua, before it replaces this module with a changed copy).
function M.close()
  drop()
end

-- One framed exchange on the open connection: the answer table, or nil and why.
local function exchange(req)
  last_id = last_id + 1
  local id = tostring(last_id)
  req.v = M.PROTOCOL
  local body = M.encode(req)
  local sent, err = conn:send(M.MAGIC .. " " .. id .. " " .. #body .. "\n" .. body)
  if not sent then return nil, tostring(err) end
  local head, rerr = conn:receive("*l")
  if not head then return nil, tostring(rerr) end
  local magic, aid, len = string.match(head, "^(%S+) (%d+) (%d+)$")
  if magic ~= M.MAGIC then return nil, "unreadable answer header (protocol " .. M.PROTOCOL .. " expected)" end
  len = tonumber(len)
  if len > M.MAX_ANSWER then return nil, "answer too long (" .. len .. " bytes)" end
  local answer, berr = conn:receive(len)
  if not answer then return nil, tostring(berr) end
  if aid ~= id then return nil, "mismatched answer (id " .. aid .. " for request " .. id .. ")", true end
  local t, derr = M.decode(answer)
  if not t then return nil, "unreadable answer (" .. tostring(derr) .. ")" end
  if tostring(t.id) ~= id then return nil, "mismatched answer (id " .. tostring(t.id) .. " in its body)", true end
  return t
end

-- The socket job_submit.lua asks on: settings.controller_socket, or settings.socket where it is unset.
function M.controller_socket()
  local s = M.settings.controller_socket
  if type(s) == "string" and s ~= "" then return s end
  return M.settings.socket
end

-- Send one request table to the socket at `path` (default settings.socket); return the answer table,
-- or nil and why the service could not answer. Any failure drops the connection: the next request
-- starts on a fresh one, never after a stray answer. A Lua state asks on one socket only (the kept
-- connection is reused for it).
function M.ask(req, path)
  path = path or M.settings.socket
  if now() < quiet_until then
    return nil, "the service did not answer within " .. M.settings.timeout .. " s a moment ago (not asked again for "
      .. M.settings.backoff .. " s)"
  end
  local why
  for attempt = 1, 2 do  -- a kept connection may have gone stale (service restarted): reconnect once
    local fresh = conn == nil
    if fresh then
      if not unix_ok then return nil, "lua-socket (socket.unix) is not installed here" end
      local c = unix.stream()
      c:settimeout(M.settings.timeout)
      local ok, err = c:connect(path)
      if not ok then
        c:close()
        return nil, "cannot connect to " .. path .. " (" .. tostring(err) .. ")"
      end
      conn = c
    end
    local t, err, mismatch = exchange(req)
    if t then return t end
    why = err
    drop()
    if why == "timeout" then
      quiet_until = now() + M.settings.backoff
      return nil, "no answer within " .. M.settings.timeout .. " s"
    end
    if mismatch or fresh then break end  -- only a stale kept connection is worth one more try
  end
  return nil, why
end

return M
