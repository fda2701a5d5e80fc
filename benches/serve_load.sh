#!/usr/bin/env bash
# Load test of `anemone serve` with `anemone bench --url`, and the prefix-reuse TTFT gain.
#
#   benches/serve_load.sh MODEL [NAME]      # MODEL: a checkpoint (.gguf / HF dir) or a bundle
#
# Env: ANEMONE (binary, default target/release/anemone), BACKEND (bundles; default executor),
# PORT (default 18080), OUT (JSON reports, default a temp dir), SESSIONS (--max-sessions, 4),
# PROMPT_LEN (words per load-test prompt, 64), GEN (tokens per request, 32), SYSTEM_WORDS (words
# of the prefix-reuse system prompt, 150: ~680 tokens with SmolLM2; use 60 for a 512-token bundle).
#
# 1. Throughput and TTFT p50/p95 at 1, 8 and 32 concurrent streaming clients (greedy,
#    distinct synthetic prompts), one `anemone bench --url --json` report per level.
# 2. Prefix reuse: a chat with a long system prompt; TTFT of its second turn (continues from the
#    first turn's kept KV state) against the same second turn sent cold (a different system
#    prompt of the same length, so nothing is reused), 5 pairs, medians. TTFT here is the
#    wall time of a non-streaming request with max_tokens 1 (prefill + one token).
# Prints machine load (uptime) before and after: the figures depend on it.
set -euo pipefail
MODEL=${1:?usage: serve_load.sh MODEL [NAME]}
NAME=${2:-m}
A=${ANEMONE:-target/release/anemone}
PORT=${PORT:-18080}
SESSIONS=${SESSIONS:-4}
PROMPT_LEN=${PROMPT_LEN:-64}
GEN=${GEN:-32}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
URL=http://127.0.0.1:$PORT
backend=()
[ -f "$MODEL/anemone.json" ] && backend=(--backend "${BACKEND:-executor}")

echo "load before: $(uptime)"
"$A" serve --model "$NAME=$MODEL" "${backend[@]}" --port "$PORT" --max-sessions "$SESSIONS" \
  --queue 64 --no-verify >"$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "$URL/health" >/dev/null 2>&1 && break
  sleep 0.5
done

# Warm-up (first-touch page faults, thread pools).
"$A" bench --url "$URL" --model-name "$NAME" --concurrency 1 --requests 2 \
  --prompt-len "$PROMPT_LEN" --gen "$GEN" --json >/dev/null

for c in 1 8 32; do
  n=$((c < 8 ? 8 : 2 * c))
  "$A" bench --url "$URL" --model-name "$NAME" --concurrency $c --requests $n \
    --prompt-len "$PROMPT_LEN" --gen "$GEN" --json >"$OUT/load-c$c.json"
  jq -r --arg c $c '.report | "clients \($c): \(.completed)/\(.requests) ok, \(.errors) errors, " +
    "\(.output_tok_s*10|round/10) output tok/s, \(.request_throughput*100|round/100) req/s, " +
    "TTFT p50 \(.ttft_p50_s*1000|round) ms p95 \(.ttft_p95_s*1000|round) ms, " +
    "ITL p50 \(.itl_p50_s*1000|round) ms"' "$OUT/load-c$c.json"
done

# Prefix reuse.
python3 - "$URL" "$NAME" "${SYSTEM_WORDS:-150}" <<'EOF' | tee "$OUT/prefix.json"
import json, statistics, sys, time, urllib.request
url, name, system_words = sys.argv[1], sys.argv[2], int(sys.argv[3])
def post(messages, max_tokens):
    body = json.dumps({"model": name, "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body,
                                 {"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req) as r:
        out = json.load(r)
    return time.perf_counter() - t, out
def system(seed):
    words = ["river", "stone", "cloud", "lamp", "garden", "window", "bridge", "orange"]
    return " ".join(f"{words[(i * 3 + seed) % 8]}{seed}-{i % 13}" for i in range(system_words))
warm, cold, cached, prompt = [], [], [], 0
for k in range(5):
    turn1 = [{"role": "system", "content": system(2 * k)},
             {"role": "user", "content": "Summarise the list in one word."}]
    _, a = post(turn1, 8)
    answer = a["choices"][0]["message"]["content"]
    follow = [{"role": "assistant", "content": answer},
              {"role": "user", "content": "And in two words?"}]
    t_warm, b = post(turn1 + follow, 1)
    other = [{"role": "system", "content": system(2 * k + 1)}, turn1[1]] + follow
    t_cold, c = post(other, 1)
    warm.append(t_warm); cold.append(t_cold)
    cached.append(b["usage"]["prompt_tokens_details"]["cached_tokens"])
    prompt = b["usage"]["prompt_tokens"]
    assert c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, c
w, c = statistics.median(warm), statistics.median(cold)
print(json.dumps({"second_turn_prompt_tokens": prompt, "cached_tokens": cached,
                  "ttft_cold_s": cold, "ttft_second_turn_s": warm,
                  "median_cold_ms": round(c * 1e3, 1), "median_second_turn_ms": round(w * 1e3, 1),
                  "gain": round(c / w, 2)}))
EOF
echo "load after: $(uptime)"
echo "reports in $OUT"
