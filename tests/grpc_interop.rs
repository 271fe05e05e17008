//! `GrpcRetryLayer` beside gRPC's own retrying client (grpcio, the C core),
//! against one scripted gRPC server, scenario by scenario (issue 51).
//!
//! `.ci/grpc-interop/interop.py` serves every scenario of
//! `.ci/grpc-interop/scenarios.json` and makes its calls through grpcio's
//! retrying channel with the scenario's service config; meanwhile this test
//! makes the same calls through `GrpcRetryLayer` over a tonic `Channel`. Per
//! call, the two are compared on what the server saw and what the caller got:
//! the attempts that reached the server, `grpc-previous-rpc-attempts`, the
//! `grpc-timeout` each attempt carried (the time left), the spacing of the
//! attempts against A6's bounds, and the final status. Every difference must
//! be one the scenario lists, with the line of A6 that allows it (A6 as of
//! the commit the scenarios file names); any other fails the test.
//!
//! grpcio implements no `hedgingPolicy`, so hedging scenarios compare the
//! layer with what A6 says, written in the scenario.
//!
//! Real time, about 5 s: each client's scenarios start 25 ms apart (the
//! longest call waits for an 800 ms deadline). Needs `python3` with `grpcio`:
//! `.ci/run` installs the pinned version into a venv and names it in
//! `GRPC_INTEROP_PYTHON`, which makes a missing grpcio fail the suite;
//! anywhere else a missing `python3` or grpcio skips it, saying so loudly.
//! The table of docs/RESULTS.md is what
//! `cargo test --all-features --test grpc_interop -- --nocapture` prints.
#![cfg(feature = "grpc")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Code;
use tonic_prost::ProstCodec;
use tower::Layer;
use tower_backoff::grpc::{GrpcRetryLayer, ServiceConfig};

/// How much later than A6's bound an attempt may reach the server: the
/// scheduling of two processes on a loaded machine.
const LATE: f64 = 40.0;
/// How much earlier (clocks read at different points of the same path).
const EARLY: f64 = 5.0;
/// How much less than the time left an attempt may carry: the first
/// attempt's own way to the server, which the reckoning counts from.
const SHORT: f64 = 60.0;
/// Between one scenario's start and the next's, as on the Python side.
const STAGGER: Duration = Duration::from_millis(25);

/// What one client's call did: the caller's outcome, and the attempts the
/// server saw.
#[derive(Debug, Clone, Default)]
struct Call {
    code: String,
    elapsed_ms: f64,
    attempts: Vec<Attempt>,
}

#[derive(Debug, Clone)]
struct Attempt {
    /// Seconds, on the server's clock.
    at: f64,
    previous: Option<String>,
    /// Milliseconds the attempt's `grpc-timeout` left, if it had one.
    left_ms: Option<f64>,
}

fn python() -> String {
    std::env::var("GRPC_INTEROP_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn suite_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/grpc-interop")
}

/// The scenario's service config, as the Python side builds it.
fn service_config(scenario: &Value) -> ServiceConfig {
    let mut method = json!({"name": [{"service": "interop.Test"}]});
    for (key, value) in scenario["policy"].as_object().unwrap() {
        method[key] = value.clone();
    }
    let mut config = json!({"methodConfig": [method]});
    if let Some(throttling) = scenario.get("throttling") {
        config["retryThrottling"] = throttling.clone();
    }
    ServiceConfig::from_json(&config.to_string()).unwrap()
}

fn code_name(code: Code) -> String {
    let name = match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    };
    name.to_owned()
}

/// The scenario's calls through `GrpcRetryLayer`: (call name, code, ms).
async fn run_layer(scenario: Value, port: u16) -> Vec<(String, String, f64)> {
    let name = scenario["name"].as_str().unwrap().to_owned();
    let mut builder = GrpcRetryLayer::builder(&service_config(&scenario));
    // A6 has no cap on hedging; 1.0 comes closest. `null` keeps the default.
    match scenario.get("hedge_load_cap") {
        Some(Value::Null) => {}
        Some(cap) => builder = builder.hedge_load_cap(cap.as_f64().unwrap()),
        None => builder = builder.hedge_load_cap(1.0),
    }
    let layer = builder.build().unwrap();
    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let service = layer.layer(channel);
    let timeout = scenario["timeout_ms"].as_u64().map(Duration::from_millis);
    let calls = scenario["calls"].as_u64().unwrap_or(1);
    let path = PathAndQuery::from_str(&format!("/interop.Test/{name}")).unwrap();
    let one = |index: u64| {
        let mut grpc = tonic::client::Grpc::new(service.clone());
        let path = path.clone();
        let call = format!("layer/{name}/{index}");
        async move {
            let mut request = tonic::Request::new(());
            request
                .metadata_mut()
                .insert("x-call", call.parse().unwrap());
            if let Some(timeout) = timeout {
                request.set_timeout(timeout);
            }
            let started = Instant::now();
            grpc.ready().await.unwrap();
            let codec = ProstCodec::<(), ()>::default();
            let code = match grpc.unary(request, path, codec).await {
                Ok(_) => Code::Ok,
                Err(status) => status.code(),
            };
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            (call, code_name(code), elapsed)
        }
    };
    if scenario["concurrent"].as_bool().unwrap_or(false) {
        futures::future::join_all((0..calls).map(one)).await
    } else {
        let mut outcomes = Vec::new();
        for index in 0..calls {
            outcomes.push(one(index).await);
        }
        outcomes
    }
}

/// A6's window, in ms, for the wait between attempt `i` and `i + 1` of a
/// retried call: the server's own delay on attempt `i`, then exactly its
/// pushback, or `min(initial × multiplier^(n-1), max) × (0.8, 1.2)` with `n`
/// counted since the last pushback (A6 lines 113 and 209).
fn retry_windows(policy: &Value, script: &[Value], attempts: usize) -> Vec<(f64, f64)> {
    let seconds = |key: &str| {
        let text = policy[key].as_str().unwrap();
        text.trim_end_matches('s').parse::<f64>().unwrap() * 1000.0
    };
    let (initial, max) = (seconds("initialBackoff"), seconds("maxBackoff"));
    let multiplier = policy["backoffMultiplier"].as_f64().unwrap();
    let mut n = 0;
    (0..attempts.saturating_sub(1))
        .map(|i| {
            let answer = &script[i.min(script.len() - 1)];
            let work = answer["delay_ms"].as_f64().unwrap_or(0.0);
            match answer["pushback"]
                .as_str()
                .and_then(|p| p.parse::<i32>().ok())
            {
                Some(pushback) if pushback >= 0 => {
                    n = 0;
                    (work + f64::from(pushback), work + f64::from(pushback))
                }
                _ => {
                    n += 1;
                    let backoff = (initial * multiplier.powi(n - 1)).min(max);
                    (work + 0.8 * backoff, work + 1.2 * backoff)
                }
            }
        })
        .collect()
}

/// Whether every call's `values` are as `listed`: `{"per_call": [..]}`
/// names each call's; a list names the values any call may have; anything
/// else is every call's.
fn as_listed(values: &[Value], listed: &Value) -> bool {
    if let Some(per_call) = listed.get("per_call") {
        return per_call.as_array().is_some_and(|p| p.as_slice() == values);
    }
    values.iter().all(|value| match listed {
        Value::Array(alternatives) => alternatives.contains(value),
        listed => value == listed,
    })
}

/// Checks one client's calls against the rules both must keep whatever the
/// other does: `grpc-previous-rpc-attempts` (A6 line 316), the time left
/// each attempt carries (line 101), the spacing of the attempts (lines 113,
/// 147, 153, 209) and when the call ends. Returns the broken ones.
fn rules_kept(scenario: &Value, client: &str, calls: &[Call], hedged: bool) -> Vec<String> {
    let mut broken = Vec::new();
    let timeout = scenario["timeout_ms"].as_f64();
    for (index, call) in calls.iter().enumerate() {
        let what = format!("{client} call {index}");
        let mut marks: Vec<Option<u64>> = call
            .attempts
            .iter()
            .map(|a| a.previous.as_deref().map(|p| p.parse().unwrap()))
            .collect();
        marks.sort();
        let expected: Vec<Option<u64>> = (0..call.attempts.len() as u64)
            .map(|n| (n > 0).then_some(n))
            .collect();
        if marks != expected {
            broken.push(format!(
                "{what}: grpc-previous-rpc-attempts {marks:?}, not {expected:?}"
            ));
        }
        let Some(first) = call.attempts.first() else {
            broken.push(format!("{what}: no attempt reached the server"));
            continue;
        };
        for attempt in &call.attempts {
            match (timeout, attempt.left_ms) {
                (None, None) => {}
                (Some(timeout), Some(left)) => {
                    // The time left at the first attempt, less the time
                    // since; the first carries the whole deadline (grpcio
                    // rounds its values up, by a few percent at most).
                    let first_left = first.left_ms.unwrap_or(timeout);
                    let due = first_left - (attempt.at - first.at) * 1000.0;
                    let off = left - due;
                    if !(-SHORT..=15.0 + 0.05 * due.max(0.0)).contains(&off)
                        || first_left > timeout * 1.05 + 1.0
                        || first_left < timeout - SHORT
                    {
                        broken.push(format!(
                            "{what}: an attempt carried {left:.0} ms, {due:.0} ms were left"
                        ));
                    }
                }
                (timeout, left) => broken.push(format!(
                    "{what}: deadline {timeout:?} ms, an attempt carried {left:?} ms"
                )),
            }
        }
        let mut arrivals: Vec<f64> = call.attempts.iter().map(|a| a.at).collect();
        arrivals.sort_by(f64::total_cmp);
        let gaps: Vec<f64> = arrivals
            .windows(2)
            .map(|w| (w[1] - w[0]) * 1000.0)
            .collect();
        let windows: Vec<(f64, f64)> = if hedged {
            // Hedging's windows are the scenario's: whether a copy goes at
            // once or after hedgingDelay depends on the other copies.
            scenario["gaps"]
                .as_array()
                .map(|w| {
                    w.iter()
                        .map(|w| (w[0].as_f64().unwrap(), w[1].as_f64().unwrap()))
                        .collect()
                })
                .unwrap_or_default()
        } else {
            let answers = scenario["answers"].as_array().unwrap();
            let script = answers[index.min(answers.len() - 1)].as_array().unwrap();
            retry_windows(&scenario["policy"]["retryPolicy"], script, arrivals.len())
        };
        for (gap, (low, high)) in gaps.iter().zip(windows) {
            if *gap < low - EARLY || *gap > high + LATE {
                broken.push(format!(
                    "{what}: attempts {gap:.0} ms apart, A6 says {low:.0} to {high:.0} ms"
                ));
            }
        }
        let side = if client == "grpcio" {
            "reference"
        } else {
            client
        };
        if let Some(window) = scenario["ends_ms"].get(side) {
            let (low, high) = (window[0].as_f64().unwrap(), window[1].as_f64().unwrap());
            if !(low..=high).contains(&call.elapsed_ms) {
                broken.push(format!(
                    "{what}: ended after {:.0} ms, not within {low:.0} to {high:.0} ms",
                    call.elapsed_ms
                ));
            }
        }
    }
    broken
}

/// How a scenario's calls went, for the table: attempts and codes, one
/// entry per call when they differ.
fn summary(attempts: &[Value], codes: &[Value]) -> String {
    let join = |values: &[Value]| {
        let texts: Vec<String> = values
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect();
        if texts.iter().all(|t| *t == texts[0]) {
            texts[0].clone()
        } else {
            texts.join(", ")
        }
    };
    format!("{} × {}", join(attempts), join(codes))
}

/// Says why the suite did not run, past the test harness's capture of
/// `eprintln!`, so that a passing run shows it.
fn skip(why: &str) {
    let _ = writeln!(std::io::stderr(), "\n\n*** SKIPPED: {why} ***\n");
}

#[test]
fn grpc_retry_layer_makes_the_calls_grpcs_own_client_makes() {
    let python = python();
    if let Err(error) = Command::new(&python).arg("--version").output() {
        return skip(&format!(
            "the gRPC interop suite needs {python} ({error}); .ci/run installs it with grpcio"
        ));
    }
    let grpcio = Command::new(&python)
        .args(["-c", "import grpc; print(grpc.__version__)"])
        .output()
        .unwrap();
    if !grpcio.status.success() {
        // CI names its interpreter, and must run the suite.
        assert!(
            std::env::var_os("GRPC_INTEROP_PYTHON").is_none(),
            "the gRPC interop suite needs grpcio for {python}:\n{}",
            String::from_utf8_lossy(&grpcio.stderr)
        );
        return skip(&format!(
            "the gRPC interop suite needs grpcio for {python} \
             (`{python} -m pip install grpcio==1.85.4`); .ci/run installs it"
        ));
    }
    let started = Instant::now();
    let scenarios_path = suite_dir().join("scenarios.json");
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(&scenarios_path).unwrap()).unwrap();
    let scenarios = file["scenarios"].as_array().unwrap().clone();
    assert!(scenarios.len() >= 30, "{} scenarios", scenarios.len());

    let mut child = Command::new(&python)
        .arg(suite_dir().join("interop.py"))
        .arg(&scenarios_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut next_line = || {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).expect("a line of JSON from interop.py")
    };
    let ports = next_line();
    // grpcio's calls first, then the layer's: the server answers one
    // client at a time, each scenario starting a little after the last.
    let grpcio_outcomes = next_line();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let layer_outcomes: Vec<(String, String, f64)> = runtime.block_on(async {
        let mut tasks = Vec::new();
        for scenario in &scenarios {
            let port = ports["ports"][scenario["name"].as_str().unwrap()]
                .as_u64()
                .unwrap();
            tasks.push(tokio::spawn(run_layer(scenario.clone(), port as u16)));
            tokio::time::sleep(STAGGER).await;
        }
        futures::future::join_all(tasks)
            .await
            .into_iter()
            .flat_map(Result::unwrap)
            .collect()
    });
    // Closing stdin says the layer's calls are done.
    drop(child.stdin.take());
    let server = next_line();
    assert!(child.wait().unwrap().success());
    let elapsed = started.elapsed();

    let mut calls: BTreeMap<String, Call> = BTreeMap::new();
    for (name, code, elapsed_ms) in layer_outcomes {
        calls.insert(
            name,
            Call {
                code,
                elapsed_ms,
                attempts: Vec::new(),
            },
        );
    }
    for (name, outcome) in grpcio_outcomes["grpcio"].as_object().unwrap() {
        calls.insert(
            name.clone(),
            Call {
                code: outcome["code"].as_str().unwrap().to_owned(),
                elapsed_ms: outcome["elapsed_ms"].as_f64().unwrap(),
                attempts: Vec::new(),
            },
        );
    }
    for (name, attempts) in server["server"].as_object().unwrap() {
        let call = calls.entry(name.clone()).or_default();
        for attempt in attempts.as_array().unwrap() {
            // No deadline is an infinite time left to grpcio's server.
            let left = attempt["left"].as_f64().filter(|left| *left < 1e9);
            call.attempts.push(Attempt {
                at: attempt["at"].as_f64().unwrap(),
                previous: attempt["previous"].as_str().map(str::to_owned),
                left_ms: left.map(|left| left * 1000.0),
            });
        }
    }

    let mut failures = Vec::new();
    let mut table = vec![
        "| scenario | grpcio 1.85.4 (A6 for hedging) | tower-backoff | |".to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    let mut same = 0;
    for scenario in &scenarios {
        let name = scenario["name"].as_str().unwrap();
        let hedged = scenario["policy"].get("hedgingPolicy").is_some();
        let count = scenario["calls"].as_u64().unwrap_or(1) as usize;
        let of = |client: &str| -> Vec<Call> {
            (0..count)
                .map(|i| {
                    calls
                        .get(&format!("{client}/{name}/{i}"))
                        .cloned()
                        .unwrap_or_default()
                })
                .collect()
        };
        let (grpcio, layer) = (of("grpcio"), of("layer"));
        let mut broken = rules_kept(scenario, "layer", &layer, hedged);
        // The reference: grpcio's calls, or A6's for hedging (grpcio makes
        // one attempt, hedging or not).
        let (reference_attempts, reference_codes): (Vec<Value>, Vec<Value>) = if hedged {
            for (i, call) in grpcio.iter().enumerate() {
                if call.attempts.len() != 1 {
                    broken.push(format!("grpcio call {i} hedged: the C core has no hedging"));
                }
            }
            let expected = &scenario["expected"];
            (
                expected["attempts"].as_array().unwrap().clone(),
                expected["code"].as_array().unwrap().clone(),
            )
        } else {
            broken.extend(rules_kept(scenario, "grpcio", &grpcio, false));
            (
                grpcio.iter().map(|c| json!(c.attempts.len())).collect(),
                grpcio.iter().map(|c| json!(c.code)).collect(),
            )
        };
        let layer_attempts: Vec<Value> = layer.iter().map(|c| json!(c.attempts.len())).collect();
        let layer_codes: Vec<Value> = layer.iter().map(|c| json!(c.code)).collect();
        let differences = scenario["differences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let (mut allowed, mut may_differ) = (Vec::new(), Vec::new());
        for (field, reference, ours) in [
            ("attempts", &reference_attempts, &layer_attempts),
            ("code", &reference_codes, &layer_codes),
        ] {
            let listed = differences.iter().find(|d| d["field"] == field);
            match listed {
                None if reference != ours => broken.push(format!(
                    "{field}: {reference:?} and {ours:?}, a difference the scenario does not list"
                )),
                None => {}
                Some(listed) => {
                    let kept = as_listed(reference, &listed["reference"])
                        && as_listed(ours, &listed["layer"]);
                    if !kept {
                        broken.push(format!(
                            "{field}: {reference:?} and {ours:?}, not the difference listed \
                             ({} and {})",
                            listed["reference"], listed["layer"]
                        ));
                    }
                    // A race may leave them the same in a run.
                    if reference != ours {
                        allowed.push(listed["a6"].as_u64().unwrap());
                    } else {
                        may_differ.push(listed["a6"].as_u64().unwrap());
                    }
                }
            }
        }
        allowed.dedup();
        may_differ.dedup();
        let lines = |lines: &[u64]| -> String {
            let lines: Vec<String> = lines.iter().map(u64::to_string).collect();
            lines.join(", ")
        };
        let verdict = match (allowed.is_empty(), may_differ.is_empty()) {
            (true, true) => {
                same += 1;
                "same".to_owned()
            }
            (true, false) => {
                same += 1;
                format!(
                    "same in this run (may differ: A6 line {})",
                    lines(&may_differ)
                )
            }
            (false, _) => format!("differs: A6 line {}", lines(&allowed)),
        };
        table.push(format!(
            "| `{name}` | {} | {} | {verdict} |",
            summary(&reference_attempts, &reference_codes),
            summary(&layer_attempts, &layer_codes),
        ));
        for problem in broken {
            failures.push(format!("{name}: {problem}"));
        }
    }
    println!("{}", table.join("\n"));
    println!(
        "{} scenarios, {same} the same in this run, {} with a listed difference; {:.1} s",
        scenarios.len(),
        scenarios.len() - same,
        elapsed.as_secs_f64()
    );
    std::io::stdout().flush().unwrap();
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
