-- slurm-gpushare job_submit.lua: a thin shim in slurmctld (Lua 5.1) in front of the decision service.
--
-- Install next to slurm.conf together with gpushare_client.lua (which holds the settings: the
-- socket of `slurm-gpushare filterd`, the timeout and the fail policy) and set JobSubmitPlugins=lua.
-- Jobs whose GRES do not mention gpushare, shard or mps never touch the socket: they cost one
-- string search per field. See docs/request-syntax.md and docs/admin-guide.md.

local dir = string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "./"
local client = dofile(dir .. "gpushare_client.lua")

local CLI_MARK = "gpushare-request="

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
    if answer.comment ~= nil then job_desc.comment = answer.comment end
    if not in_modify and answer.message and answer.message ~= "" then slurm.log_user("%s", answer.message) end
    return slurm.SUCCESS
  end
  local msg = answer.message or "gpushare: the request was refused"
  if in_modify then slurm.log_info("%s", msg) else slurm.log_user("%s", msg) end
  return tonumber(answer.errno) or slurm.ERROR
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local tpn, tpj = job_desc.tres_per_node, job_desc.tres_per_job
  local comment = job_desc.comment
  local marked = type(comment) == "string" and string.find(comment, CLI_MARK, 1, true) ~= nil
  if not marked and not client.mentions_share(tpn, tpj, job_desc.tres_per_socket, job_desc.tres_per_task) then
    return slurm.SUCCESS
  end
  local answer, why = client.ask({
    v = 1, op = "submit", tres_per_node = tpn or "", tres_per_job = tpj or "",
    partition = job_desc.partition or "", comment = comment or "", admin_comment = job_desc.admin_comment or "",
    user = job_desc.user_name or "", uid = submit_uid or -1,
  })
  if not answer then return unavailable(why, marked or client.mentions_gpushare(tpn, tpj)) end
  return apply(job_desc, answer, false)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local tpn = job_desc.tres_per_node
  if not client.mentions_share(tpn, job_desc.tres_per_job) then
    -- the job's GRES change to something that is not a GPU share: its gpushare audit no longer holds
    local ac = job_rec.admin_comment
    if tpn and type(ac) == "string" and string.find(ac, "[gpushare:", 1, true) then
      local rest = string.gsub(ac, "%s*%[gpushare:v%d+[^%]]*%]", "")
      -- an empty string would read as "no change": say the segment is gone
      if rest == "" then rest = "[gpushare:none]" end
      job_desc.admin_comment = rest
    end
    return slurm.SUCCESS
  end
  local answer, why = client.ask({
    v = 1, op = "modify", tres_per_node = tpn or "", tres_per_job = job_desc.tres_per_job or "",
    partition = job_desc.partition or job_rec.partition or "", comment = "",
    admin_comment = job_rec.admin_comment or "", user = "", uid = modify_uid or -1,
    job_id = tostring(job_rec.job_id or ""),
  })
  if not answer then
    slurm.log_error("gpushare: filter service unavailable for job %s update: %s", tostring(job_rec.job_id), why)
    if client.mentions_gpushare(tpn) or client.settings.fail_policy ~= "allow-direct" then return slurm.ERROR end
    return slurm.SUCCESS
  end
  return apply(job_desc, answer, true)
end

return slurm.SUCCESS
