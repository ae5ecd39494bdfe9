-- slurm-gpushare cli_filter.lua: runs inside srun/sbatch/salloc (as the user), Lua 5.1 (what
-- cli_filter_lua.so links on Slurm 22.05, 24.11 and 26.05). Set CliFilterPlugins=cli_filter/lua.
--
-- It does the least each release's clients need for --gres=gpushare:..., told apart by the TRES prefix
-- the client itself wrote into options.gres ("gres:" up to 23.02, "gres/" from 23.11 on):
--
-- * "gres/" (23.11 and later): the clients' TRES parser (slurm_get_next_tres, run by sbatch, salloc and
--   srun before they submit) refuses a GRES type holding "=" unless a number follows the last "="
--   (gpushare:mem=abc, gpushare:mode=mig, gpushare:mem=10G:2: "Invalid Trackable RESource (TRES)
--   specification"). Here every "=" of a gpushare item is written %3D, which job_submit.lua's service
--   reads as "=". Nothing else: srun takes the job's GRES, as job_submit.lua rewrote it, from the
--   allocation (from 23.02 on). No socket and no gpushare_client.lua are needed, so this works in
--   configless mode, where slurmctld ships cli_filter.lua to the clients but not gpushare_client.lua.
-- * "gres:" (22.05): sbatch and salloc need nothing, but srun --gres=gpushare:... creating its own
--   allocation would keep the raw gpushare string for its step and fail ("Step requested GRES ... not
--   found in the job"). Here srun asks the service (gpushare_client.lua, next to this file) for the
--   same decision, uses the decided GRES for the job and its step, and leaves the original request in
--   the job comment as gpushare-request=...; job_submit.lua polices the decided GRES like any direct
--   request (the comment is the user's and never trusted), takes the word only to name the request in
--   the audit when deciding it gives exactly that GRES, and removes the word from the comment.
--   Without gpushare_client.lua (configless mode) such an srun is refused with a message saying so.

local KNOB_EQUALS = "%3D"  -- slurm_gpushare.submit.request.KNOB_EQUALS

local client, client_error = nil, nil
local function load_client()
  if client or client_error then return client, client_error end
  local dir = string.match(debug.getinfo(1, "S").source, "^@(.*/)") or "./"
  local ok, mod = pcall(dofile, dir .. "gpushare_client.lua")
  if ok and type(mod) == "table" then client = mod else client_error = tostring(mod) end
  return client, client_error
end

local function mentions_gpushare(s)
  return type(s) == "string" and string.find(s, "gpushare", 1, true) ~= nil
end

-- Each gpushare item with its "=" written as KNOB_EQUALS; other items as they are.
local function escape_knobs(gres)
  local out = {}
  for item in string.gmatch(gres, "[^,]+") do
    local name = string.match(item, "^gres[/:]([^:]*)") or string.match(item, "^([^:]*)")
    if name == "gpushare" then item = string.gsub(item, "=", function() return KNOB_EQUALS end) end
    out[#out + 1] = item
  end
  return table.concat(out, ",")
end

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  local gres = options["gres"]
  if not mentions_gpushare(gres) then return slurm.SUCCESS end
  if string.sub(gres, 1, 5) == "gres/" then
    options["gres"] = escape_knobs(gres)
    return slurm.SUCCESS
  end
  if options["type"] ~= "srun" or os.getenv("SLURM_JOB_ID") then return slurm.SUCCESS end
  local c, why = load_client()
  if not c then
    slurm.log_error("%s", "gpushare: srun --gres=gpushare:... needs gpushare_client.lua next to cli_filter.lua " ..
      "on this host (configless mode does not ship it: install it with the slurm-gpushare package, or run " ..
      "the command inside an allocation from sbatch/salloc); cannot load it: " .. why)
    return slurm.ERROR
  end
  local answer = c.ask({ op = "cli", tres_per_node = gres, partition = options["partition"] or "",
                         min_nodes = tonumber(options["nodes"] or "") or -1,
                         num_tasks = tonumber(options["ntasks"] or "") or -1,
                         ntasks_per_node = tonumber(options["ntasks-per-node"] or "") or -1 })
  if not answer then return slurm.SUCCESS end  -- job_submit.lua reports the unavailable service
  if answer.action == "rewrite" and answer.gres then
    options["gres"] = answer.gres
    -- names the original request for the audit only: job_submit.lua decides the GRES it sees
    local cm = options["comment"]
    options["comment"] = ((type(cm) == "string" and cm ~= "") and (cm .. " ") or "") .. (answer.mark or "")
  elseif answer.action == "reject" then
    slurm.log_error("%s", answer.message or "gpushare: the request was refused")
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
  return slurm.SUCCESS
end
