-- wrk script for benchmarks/http_load.py: demo-5 sized multi-head attention with fresh random embeddings
-- in every request (5x8, 4 heads, causal), and a JSON summary line at the end.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

local parts = {}
request = function()
  for i = 1, 5 do
    local row = {}
    for j = 1, 8 do row[j] = string.format("%.17g", math.random() * 2 - 1) end
    parts[i] = "[" .. table.concat(row, ",") .. "]"
  end
  local body = '{"embeddings":[' .. table.concat(parts, ",") .. '],"n_heads":4,"causal":true}'
  return wrk.format(nil, nil, nil, body)
end

done = function(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
               + summary.errors.timeout + summary.errors.status
  io.write(string.format(
    'SUMMARY {"requests":%d,"seconds":%.6f,"errors":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration / 1e6, errors, latency:percentile(50), latency:percentile(99), latency.max))
end
