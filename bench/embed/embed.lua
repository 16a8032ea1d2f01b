-- wrk script for the embed scenario: POSTs JSON bodies to the URL's path (/embed or
-- /v1/embeddings), cycling through a file with one complete body per line, e.g.
--   {"inputs": "one sentence"}                       TEI, 1 sentence per request
--   {"inputs": ["s1", "s2", ..., "s32"]}             TEI, 32 per request
--   {"input": ["s1", ...], "model": "all-MiniLM-L6-v2"}  OpenAI's /v1/embeddings
-- The file is the script's first argument (wrk ... -s embed.lua URL -- FILE) or, when there
-- is none, $EMBED_BODIES (bench/scenarios/embed.py writes it under bench/out/embed/).
-- Requests are formatted once in init(); with wrk -t1 one counter serves every connection,
-- so the bodies are sent in turn, evenly. Bodies are prepared as JSON outside: Lua here
-- neither parses nor escapes anything.

local requests = {}
local n, i = 0, 0

function init(args)
   local path = args[1] or os.getenv("EMBED_BODIES")
   if not path then
      error("embed.lua: name a bodies file (wrk ... -- FILE, or EMBED_BODIES=FILE)")
   end
   local headers = {["Content-Type"] = "application/json"}
   for line in io.lines(path) do
      if #line > 0 then
         n = n + 1
         requests[n] = wrk.format("POST", nil, headers, line)
      end
   end
   if n == 0 then
      error("embed.lua: no bodies in " .. path)
   end
end

function request()
   i = i % n + 1
   return requests[i]
end
