//! Server counters, exposed at `GET /metrics` in Prometheus' text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the time-to-first-token histogram.
const TTFT_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Default)]
pub struct Metrics {
    /// Answers by (endpoint, status).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub queued: AtomicUsize,
    pub active: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    pub rejected_full: AtomicU64,
    /// Nanoseconds spent generating after the first token, summed.
    decode_nanos: AtomicU64,
    ttft: Mutex<Histogram>,
}

#[derive(Default)]
struct Histogram {
    counts: [u64; TTFT_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Metrics {
    pub fn record_response(&self, endpoint: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    pub fn record_completion(
        &self,
        prompt: usize,
        cached: usize,
        generated: usize,
        ttft: f64,
        decode: f64,
    ) {
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(generated as u64, Ordering::Relaxed);
        self.decode_nanos
            .fetch_add((decode * 1e9) as u64, Ordering::Relaxed);
        let mut h = self.ttft.lock().unwrap_or_else(|p| p.into_inner());
        for (i, bound) in TTFT_BUCKETS.iter().enumerate() {
            if ttft <= *bound {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += ttft;
    }

    /// The Prometheus text exposition.
    pub fn render(&self, kept_bytes: usize, kept_sessions: usize) -> String {
        let mut out = String::new();
        let requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        out.push_str("# HELP anemone_requests_total Requests answered, by endpoint and HTTP status.\n# TYPE anemone_requests_total counter\n");
        for ((endpoint, status), n) in requests.iter() {
            let _ = writeln!(
                out,
                "anemone_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        drop(requests);
        let gauge = |out: &mut String, name: &str, help: &str, kind: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        gauge(
            &mut out,
            "anemone_queue_depth",
            "Requests waiting for a session.",
            "gauge",
            self.queued.load(Ordering::Relaxed).to_string(),
        );
        gauge(
            &mut out,
            "anemone_active_sessions",
            "Requests generating now.",
            "gauge",
            self.active.load(Ordering::Relaxed).to_string(),
        );
        gauge(
            &mut out,
            "anemone_kept_sessions",
            "Sessions kept for prefix reuse.",
            "gauge",
            kept_sessions.to_string(),
        );
        gauge(
            &mut out,
            "anemone_kept_kv_bytes",
            "Bytes of KV state kept for prefix reuse.",
            "gauge",
            kept_bytes.to_string(),
        );
        gauge(
            &mut out,
            "anemone_prompt_tokens_total",
            "Prompt tokens received.",
            "counter",
            load(&self.prompt_tokens),
        );
        gauge(
            &mut out,
            "anemone_cached_prompt_tokens_total",
            "Prompt tokens found in a kept session (not prefilled).",
            "counter",
            load(&self.cached_tokens),
        );
        gauge(
            &mut out,
            "anemone_generated_tokens_total",
            "Tokens generated.",
            "counter",
            load(&self.generated_tokens),
        );
        gauge(
            &mut out,
            "anemone_requests_cancelled_total",
            "Generations cancelled (client gone or shutdown).",
            "counter",
            load(&self.cancelled),
        );
        gauge(
            &mut out,
            "anemone_requests_rejected_total",
            "Requests answered 429 (queue full).",
            "counter",
            load(&self.rejected_full),
        );
        let decode_s = self.decode_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let generated = self.generated_tokens.load(Ordering::Relaxed) as f64;
        let rate = if decode_s > 0.0 {
            generated / decode_s
        } else {
            0.0
        };
        gauge(
            &mut out,
            "anemone_decode_tokens_per_second",
            "Generated tokens per second of generation time, since start.",
            "gauge",
            format!("{rate:.3}"),
        );
        let h = self.ttft.lock().unwrap_or_else(|p| p.into_inner());
        out.push_str("# HELP anemone_ttft_seconds Time from a request's start of work to its first token.\n# TYPE anemone_ttft_seconds histogram\n");
        for (bound, n) in TTFT_BUCKETS.iter().zip(h.counts) {
            let _ = writeln!(out, "anemone_ttft_seconds_bucket{{le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "anemone_ttft_seconds_bucket{{le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(out, "anemone_ttft_seconds_sum {}", h.sum);
        let _ = writeln!(out, "anemone_ttft_seconds_count {}", h.count);
        out
    }
}
