//! A load generator for any OpenAI-compatible server (`anemone bench --url`): `concurrency`
//! clients send `requests` streaming chat completions between them and time each one — time to
//! first token, inter-token latency (between content chunks), end to end — as vLLM's
//! `benchmark_serving` reports them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080` (`/v1/chat/completions` is appended).
    pub url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub concurrency: usize,
    pub requests: usize,
    /// One prompt per request, used in turn.
    pub prompts: Vec<String>,
    pub max_tokens: usize,
}

/// One request's timings.
#[derive(Debug, Clone, Serialize)]
pub struct RequestTiming {
    pub ok: bool,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub ttft_s: Option<f64>,
    pub e2e_s: f64,
    pub output_chunks: usize,
    pub completion_tokens: Option<usize>,
    /// Seconds between consecutive content chunks.
    pub itl_s: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub url: String,
    pub model: String,
    pub concurrency: usize,
    pub requests: usize,
    pub completed: usize,
    pub errors: usize,
    pub duration_s: f64,
    pub request_throughput: f64,
    pub output_tokens: usize,
    pub output_tok_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p95_s: f64,
    pub itl_p50_s: f64,
    pub itl_p95_s: f64,
    pub e2e_p50_s: f64,
    pub timings: Vec<RequestTiming>,
}

/// The `q` quantile (0..=1) of `values` by nearest rank; 0 when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Runs the load; `on_done` is called after each request (a progress bar).
pub async fn run(config: LoadConfig, on_done: impl Fn() + Send + Sync + 'static) -> LoadReport {
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let config = Arc::new(config);
    let on_done = Arc::new(on_done);
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..config.concurrency.max(1) {
        let (client, next, config, on_done) = (
            client.clone(),
            Arc::clone(&next),
            Arc::clone(&config),
            Arc::clone(&on_done),
        );
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= config.requests {
                    break;
                }
                let prompt = &config.prompts[i % config.prompts.len().max(1)];
                out.push(one_request(&client, &config, prompt).await);
                on_done();
            }
            out
        }));
    }
    let mut timings = Vec::new();
    for w in workers {
        if let Ok(t) = w.await {
            timings.extend(t);
        }
    }
    let duration_s = started.elapsed().as_secs_f64();
    summarize(&config, timings, duration_s)
}

fn summarize(config: &LoadConfig, timings: Vec<RequestTiming>, duration_s: f64) -> LoadReport {
    let ok: Vec<&RequestTiming> = timings.iter().filter(|t| t.ok).collect();
    let ttft: Vec<f64> = ok.iter().filter_map(|t| t.ttft_s).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|t| t.itl_s.iter().copied()).collect();
    let e2e: Vec<f64> = ok.iter().map(|t| t.e2e_s).collect();
    let output_tokens: usize = ok
        .iter()
        .map(|t| t.completion_tokens.unwrap_or(t.output_chunks))
        .sum();
    let per_s = |n: usize| {
        if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        }
    };
    LoadReport {
        url: config.url.clone(),
        model: config.model.clone(),
        concurrency: config.concurrency,
        requests: config.requests,
        completed: ok.len(),
        errors: timings.len() - ok.len(),
        duration_s,
        request_throughput: per_s(ok.len()),
        output_tokens,
        output_tok_s: per_s(output_tokens),
        ttft_p50_s: quantile(&ttft, 0.5),
        ttft_p95_s: quantile(&ttft, 0.95),
        itl_p50_s: quantile(&itl, 0.5),
        itl_p95_s: quantile(&itl, 0.95),
        e2e_p50_s: quantile(&e2e, 0.5),
        timings,
    }
}

async fn one_request(client: &reqwest::Client, config: &LoadConfig, prompt: &str) -> RequestTiming {
    let started = Instant::now();
    let mut timing = RequestTiming {
        ok: false,
        status: None,
        error: None,
        ttft_s: None,
        e2e_s: 0.0,
        output_chunks: 0,
        completion_tokens: None,
        itl_s: Vec::new(),
    };
    let body = json!({
        "model": config.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": config.max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let url = format!("{}/v1/chat/completions", config.url.trim_end_matches('/'));
    let mut request = client
        .post(url)
        .json(&body)
        .timeout(Duration::from_secs(600));
    if let Some(key) = &config.api_key {
        request = request.bearer_auth(key);
    }
    let result = async {
        let response = request.send().await.map_err(|e| e.to_string())?;
        timing.status = Some(response.status().as_u16());
        if !response.status().is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(format!(
                "HTTP {}: {}",
                timing.status.unwrap_or(0),
                text.trim()
            ));
        }
        let mut stream = response.bytes_stream();
        let mut buffer = String::new();
        let mut last = None::<Instant>;
        while let Some(bytes) = stream.next().await {
            let bytes = bytes.map_err(|e| e.to_string())?;
            buffer.push_str(&String::from_utf8_lossy(&bytes));
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                for line in event.lines() {
                    let Some(data) = line.strip_prefix("data:") else {
                        continue;
                    };
                    let data = data.trim();
                    if data == "[DONE]" {
                        return Ok(());
                    }
                    let value: serde_json::Value =
                        serde_json::from_str(data).map_err(|e| format!("bad chunk {data}: {e}"))?;
                    if let Some(err) = value.get("error") {
                        return Err(format!("error event: {err}"));
                    }
                    if let Some(n) = value["usage"]["completion_tokens"].as_u64() {
                        timing.completion_tokens = Some(n as usize);
                    }
                    let content = value["choices"][0]["delta"]["content"]
                        .as_str()
                        .unwrap_or("");
                    if !content.is_empty() {
                        let now = Instant::now();
                        match last {
                            None => timing.ttft_s = Some((now - started).as_secs_f64()),
                            Some(prev) => timing.itl_s.push((now - prev).as_secs_f64()),
                        }
                        last = Some(now);
                        timing.output_chunks += 1;
                    }
                }
            }
        }
        Ok(())
    }
    .await;
    timing.e2e_s = started.elapsed().as_secs_f64();
    match result {
        Ok(()) => timing.ok = true,
        Err(e) => timing.error = Some(e),
    }
    timing
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn nearest_rank_quantiles() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.95), 5.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
