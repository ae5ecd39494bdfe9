-- slurm-gpushare job_submit.lua: a thin shim in slurmctld (Lua 5.1) in front of the decision service.
--
-- Install next to slurm.conf together with gpushare_client.lua (which holds the settings: the
-- sockets of `slurm-gpushare filterd`, the timeout and the fail policy) and set JobSubmitPlugins=lua.
-- It asks on filterd's private controller_socket (SlurmUser and root only), so that no user flooding
-- the public socket (cli_filter.lua's) can refuse or delay slurmctld; on `socket` where it is unset.
-- Jobs whose GRES do not mention gpushare, shard or mps never touch the socket: they cost one
-- string search per field. Beside the GRES it sends the job's other per-task, per-socket and per-GPU
-- fields (--gpus-per-task, --tres-per-task, --gpus-per-socket, --mem-per-gpu, --cpus-per-gpu,
-- --ntasks-per-gpu), which the service refuses beside a share. See docs/request-syntax.md and
-- docs/admin-guide.md.
--
-- slurmctld loads this file again only when its own mtime changes (checked at each submission, to the
-- second), never when gpushare_client.lua changes. So before each GPU-share job (which pays a round
-- trip to the service anyway; other jobs never) the shim reads gpushare_client.lua again and, when its
-- text changed, loads it: edited settings apply from the next such job. A changed file that does not
-- load keeps the settings in force (logged once per version of the file).

local dir = string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "./"
local CLIENT_PATH = dir .. "gpushare_client.lua"

local function read_client()
  local f = io.open(CLIENT_PATH, "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

local client_text = read_client()
local client = dofile(CLIENT_PATH)
local refused_text = nil  -- a changed text that did not load (not tried again until it changes)

-- The client with the settings gpushare_client.lua holds now (see the header).
local function current_client()
  local text = read_client()
  if text == nil or text == client_text or text == refused_text then return client end
  local chunk, err = (loadstring or load)(text, "@" .. CLIENT_PATH)
  local ok, mod = false, err
  if chunk then ok, mod = pcall(chunk) end
  if not ok or type(mod) ~= "table" or type(mod.ask) ~= "function" or type(mod.settings) ~= "table" then
    refused_text = text
    slurm.log_error("gpushare: %s changed but does not load (%s); the settings in force stay", CLIENT_PATH,
      tostring(mod))
    return client
  end
  if type(client.close) == "function" then client.close() end
  client, client_text, refused_text = mod, text, nil
  slurm.log_info("gpushare: %s changed: its settings apply from this job on", CLIENT_PATH)
  return client
end

-- cli_filter.lua's word in the comment naming an srun request (see cli_filter.lua). It names the
-- request in the audit only; it never makes a job skip the policy or changes what is decided.
local CLI_MARK_PATTERN = "gpushare%-request=(%S*)"

-- Slurm numbers of job_desc (Lua numbers; NO_VAL when unset): sent as they are, read by the service.
local function num(v)
  if type(v) == "number" then return v end
  return -1
end

-- slurm.log_user reaches the user from slurm_job_modify since Slurm 23.02 (job_modify's err_msg); 22.05 discards
-- it with an error line in slurmctld's log. GRES_ALLOW_TASK_SHARING is a constant of 23.11 and later (slurm_lua.c
-- at slurm-24-11-5-1 and slurm-26-05-3-1; not at slurm-22-05-8-1), the releases supported here that have it.
local MODIFY_TELLS_USER = slurm.GRES_ALLOW_TASK_SHARING ~= nil

local function unavailable(why, gpushare)
  if gpushare or client.settings.fail_policy ~= "allow-direct" then
    slurm.log_user("%s", "gpushare: the GPU-sharing service cannot decide this request now (" .. why ..
      "); try again in a few minutes, or ask for whole GPUs with --gres=gpu:N. " ..
      "Jobs without gpushare/shard/mps requests are not affected.")
    slurm.log_error("gpushare: filter service unavailable: %s", why)
    return slurm.ERROR
  end
  slurm.log_error("gpushare: filter service unavailable (%s); direct request passed unpoliced", why)
  return slurm.SUCCESS
end

local function apply(job_desc, answer, in_modify)
  if answer.action == "pass" then return slurm.SUCCESS end
  if answer.action == "rewrite" and type(answer.tres_per_node) == "string"
      and not string.find(answer.tres_per_node, "gpushare", 1, true) then
    job_desc.tres_per_node = answer.tres_per_node
    if answer.admin_comment then job_desc.admin_comment = answer.admin_comment end
    if not in_modify and answer.message and answer.message ~= "" then slurm.log_user("%s", answer.message) end
    return slurm.SUCCESS
  end
  local msg = answer.message or "gpushare: the request was refused"
  if in_modify then
    slurm.log_info("%s", msg)
    if MODIFY_TELLS_USER then slurm.log_user("%s", msg) end
  else
    slurm.log_user("%s", msg)
  end
  return tonumber(answer.errno) or slurm.ERROR
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local tpn, tpj = job_desc.tres_per_node, job_desc.tres_per_job
  if not client.mentions_share(tpn, tpj, job_desc.tres_per_socket, job_desc.tres_per_task) then
    return slurm.SUCCESS
  end
  current_client()
  -- the comment is the user's: only the cli_filter word is taken out of it (bounded), nothing else is sent
  local cli_request = ""
  local comment = job_desc.comment
  if type(comment) == "string" and string.find(comment, "gpushare-request=", 1, true) then
    cli_request = string.sub(string.match(comment, CLI_MARK_PATTERN) or "", 1, 256)
    local rest = string.gsub(comment, "%s*" .. CLI_MARK_PATTERN, "")
    job_desc.comment = rest
  end
  local answer, why = client.ask({
    op = "submit", tres_per_node = tpn or "", tres_per_job = tpj or "",
    tres_per_task = job_desc.tres_per_task or "", tres_per_socket = job_desc.tres_per_socket or "",
    mem_per_tres = job_desc.mem_per_tres or "", cpus_per_tres = job_desc.cpus_per_tres or "",
    ntasks_per_tres = num(job_desc.ntasks_per_tres),
    partition = job_desc.partition or "", admin_comment = job_desc.admin_comment or "",
    min_nodes = num(job_desc.min_nodes), num_tasks = num(job_desc.num_tasks),
    ntasks_per_node = num(job_desc.ntasks_per_node), cli_request = cli_request,
    uid = submit_uid or -1, het_job_offset = num(job_desc.het_job_offset),
  }, client.controller_socket())
  if not answer then return unavailable(why, client.mentions_gpushare(tpn, tpj)) end
  return apply(job_desc, answer, false)
end

-- An update that leaves a GPU-share job's GRES alone but changes what its share was decided for (another
-- partition, node count, per-task/socket/job TRES, per-GPU memory or CPUs): the service decides the job's
-- GRES again with the new fields ("move"; with the job's AdminComment, whose audit says whether the share
-- was granted for gpushare: then GPUs per task or socket, and counts per GPU, are refused beside it, as at
-- submit); nil when the update changes none of them or the job holds no share. A MIG slice or whole GPUs
-- granted for gpushare are no share by name: the audit says they were granted.
local function recheck_move(job_desc, job_rec, modify_uid)
  local held = job_rec.tres_per_node
  local ac = job_rec.admin_comment
  local granted = type(ac) == "string" and string.find(ac, "[gpushare:v", 1, true) ~= nil
  if job_desc.tres_per_node ~= nil or not (granted or client.mentions_share(held, job_rec.tres_per_job, nil, nil)) then
    return nil
  end
  local nodes = num(job_desc.min_nodes)
  if nodes >= 0xfffffffe then nodes = -1 end  -- NO_VAL/INFINITE: not changed
  if job_desc.partition == nil and job_desc.tres_per_task == nil and job_desc.tres_per_socket == nil
      and job_desc.tres_per_job == nil and job_desc.mem_per_tres == nil and job_desc.cpus_per_tres == nil
      and nodes < 0 then
    return nil
  end
  current_client()
  local answer, why = client.ask({
    op = "move", tres_per_node = held, tres_per_job = job_desc.tres_per_job or job_rec.tres_per_job or "",
    tres_per_task = job_desc.tres_per_task or job_rec.tres_per_task or "",
    tres_per_socket = job_desc.tres_per_socket or job_rec.tres_per_socket or "",
    mem_per_tres = job_desc.mem_per_tres or job_rec.mem_per_tres or "",
    cpus_per_tres = job_desc.cpus_per_tres or job_rec.cpus_per_tres or "",
    partition = job_desc.partition or job_rec.partition or "",
    min_nodes = (nodes >= 0) and nodes or num(job_rec.min_nodes), uid = modify_uid or -1,
    job_id = tostring(job_rec.job_id or ""), admin_comment = ac or "",
  }, client.controller_socket())
  if not answer then
    slurm.log_error("gpushare: filter service unavailable for job %s update: %s", tostring(job_rec.job_id), why)
    return slurm.ERROR
  end
  return apply(job_desc, answer, true)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local tpn = job_desc.tres_per_node
  local moved = recheck_move(job_desc, job_rec, modify_uid)
  if moved ~= nil and moved ~= slurm.SUCCESS then return moved end
  if not client.mentions_share(tpn, job_desc.tres_per_job, job_desc.tres_per_task, job_desc.tres_per_socket) then
    -- the job's GRES change to something that is not a GPU share: its gpushare audit no longer holds.
    -- slurmctld refuses an update that sets AdminComment unless modify_uid is root, SlurmUser or a Slurm
    -- administrator (checked after this hook), so a user's such update is refused as a whole and the job
    -- keeps its share and its audit.
    local ac = job_rec.admin_comment
    if tpn and type(ac) == "string" and string.find(ac, "[gpushare:", 1, true) then
      local rest = string.gsub(ac, "%s*%[gpushare:v%d+[^%]]*%]", "")
      -- an empty string would read as "no change": say the segment is gone
      if rest == "" then rest = "[gpushare:none]" end
      job_desc.admin_comment = rest
      slurm.log_info("gpushare: job %s (uid %s's update): GRES no longer a GPU share, audit removed; slurmctld " ..
        "refuses this update unless that uid is root, SlurmUser or a Slurm administrator",
        tostring(job_rec.job_id), tostring(modify_uid))
    end
    return slurm.SUCCESS
  end
  current_client()
  local answer, why = client.ask({
    op = "modify", tres_per_node = tpn or "", tres_per_job = job_desc.tres_per_job or "",
    tres_per_task = job_desc.tres_per_task or "", tres_per_socket = job_desc.tres_per_socket or "",
    mem_per_tres = job_desc.mem_per_tres or "", cpus_per_tres = job_desc.cpus_per_tres or "",
    ntasks_per_tres = num(job_desc.ntasks_per_tres),
    partition = job_desc.partition or job_rec.partition or "", min_nodes = num(job_desc.min_nodes),
    admin_comment = job_rec.admin_comment or "", uid = modify_uid or -1,
    job_id = tostring(job_rec.job_id or ""),
  }, client.controller_socket())
  if not answer then
    slurm.log_error("gpushare: filter service unavailable for job %s update: %s", tostring(job_rec.job_id), why)
    if client.mentions_gpushare(tpn) or client.settings.fail_policy ~= "allow-direct" then return slurm.ERROR end
    return slurm.SUCCESS
  end
  return apply(job_desc, answer, true)
end

return slurm.SUCCESS
