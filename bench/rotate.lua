-- wrk: every request carries the next credential from the file named by $COOKIES (one per
-- line), so 10,000 distinct sessions rotate through the gateway. Each wrk thread starts at its
-- own offset.
local values = {}
for line in io.lines(os.getenv("COOKIES")) do values[#values + 1] = line end
local name = os.getenv("COOKIE_NAME") or "__Host-sessiongate"
local counter = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("offset", threads * 7919)
end

function init(args)
  counter = tonumber(offset) or 0
end

function request()
  counter = counter + 1
  local value = values[(counter % #values) + 1]
  return wrk.format("GET", "/", { ["Cookie"] = name .. "=" .. value })
end
