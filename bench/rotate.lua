-- wrk: every request carries the next credential from the file named by $COOKIES (one per
-- line), so 10,000 distinct sessions rotate through the gateway. Each wrk thread starts at its
-- own offset.
local values = {}
for line in io.lines(os.getenv("COOKIES")) do values[#values + 1] = line end
local name = os.getenv("COOKIE_NAME") or "__Host-sessiongate"
-- STICKY=1: each thread keeps one credential (run wrk with as many threads as connections:
-- each connection is one browser with one session, as browsers keep theirs).
local sticky = os.getenv("STICKY") == "1"
-- CLOSE=1: one request per connection (every request pays a new connection, a TLS handshake
-- on https).
local close = os.getenv("CLOSE") == "1"
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
  if not sticky then counter = counter + 1 end
  local value = values[(counter % #values) + 1]
  local headers = { ["Cookie"] = name .. "=" .. value }
  if close then headers["Connection"] = "close" end
  return wrk.format("GET", "/", headers)
end
