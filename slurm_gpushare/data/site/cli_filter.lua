-- slurm-gpushare cli_filter.lua: runs inside srun/sbatch/salloc (as the user), Lua 5.1.
--
-- Needed only for `srun --gres=gpushare:...` that creates its own allocation: job_submit.lua
-- rewrites the job, but srun's step would keep the raw gpushare string and fail ("Step requested
-- GRES ... not found in the job"). Here srun asks the service for the same decision, uses the
-- decided GRES for the job and its step, and leaves the original request in the job comment as
-- gpushare-request=...; job_submit.lua polices the decided GRES like any direct request (the comment
-- is the user's and never trusted) and takes the word only to name the request in the audit, when
-- deciding it gives exactly that GRES; it removes the word from the comment. Install next to slurm.conf with gpushare_client.lua and set
-- CliFilterPlugins=cli_filter/lua. sbatch and salloc need nothing here.

local dir = string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "./"
local client = dofile(dir .. "gpushare_client.lua")

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  local gres = options["gres"]
  if options["type"] ~= "srun" or os.getenv("SLURM_JOB_ID") or not client.mentions_gpushare(gres) then
    return slurm.SUCCESS
  end
  local answer = client.ask({ op = "cli", tres_per_node = gres, partition = options["partition"] or "",
                              min_nodes = tonumber(options["nodes"] or "") or -1,
                              num_tasks = tonumber(options["ntasks"] or "") or -1,
                              ntasks_per_node = tonumber(options["ntasks-per-node"] or "") or -1 })
  if not answer then return slurm.SUCCESS end  -- job_submit.lua reports the unavailable service
  if answer.action == "rewrite" and answer.gres then
    options["gres"] = answer.gres
    -- names the original request for the audit only: job_submit.lua decides the GRES it sees
    local c = options["comment"]
    options["comment"] = ((type(c) == "string" and c ~= "") and (c .. " ") or "") .. (answer.mark or "")
  elseif answer.action == "reject" then
    slurm.log_error("%s", answer.message or "gpushare: the request was refused")
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
