//! Times the forward pass: batch 1 and batch 32 of ~10-token sentences, on
//! 1 and 2 compute threads.
//!
//!     cargo run --release -p m0-embed --example embed_bench -- MODEL_DIR [SECONDS [THREADS [BATCH]]]
//!     cargo run --release -p m0-embed --features profile --example embed_bench -- --profile MODEL_DIR ...
//!
//! THREADS and BATCH restrict the cases to one (for a profiler).
//! Prints, per case, the best and the median call (ms), sentences/s at the
//! best and the median, and GFLOP/s of the dense layers at the best.
//! Tokenizing is timed apart, once per case. With `--profile` (a build
//! with the `profile` feature), a second table gives each case's mean pass
//! and its share in each kind of layer (`m0_embed::model::profile`), the
//! rest being the pass's time outside them.

use m0_embed::model::profile::{self, Part};
use m0_embed::model::{Encoded, LoadOptions, Model};
use std::time::{Duration, Instant};

/// Exit codes as m0serve's (`m0serve --help`): no model folder given, and
/// a folder that does not load.
const EXIT_USAGE: i32 = 2;
const EXIT_REFUSED: i32 = 78;

const SENTENCES: [&str; 32] = [
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password on this site?",
    "A man is playing a guitar on the stage.",
    "The weather today is sunny with light wind.",
    "Please send the report before Friday noon.",
    "She bought three apples and two bananas.",
    "Our train was delayed by almost an hour.",
    "This restaurant serves the best pasta in town.",
    "The children played football in the park.",
    "Can you recommend a good book about history?",
    "The meeting has been moved to next Tuesday.",
    "He fixed the bicycle with a small wrench.",
    "My phone battery dies too quickly these days.",
    "The museum opens at nine in the morning.",
    "They watched a movie and ate some popcorn.",
    "What is the capital city of Australia?",
    "The cat is sleeping on the warm windowsill.",
    "I need to renew my passport this month.",
    "The river flows quietly through the valley.",
    "Learning a new language takes a lot of time.",
    "The store is closed on public holidays.",
    "We planted tomatoes and herbs in the garden.",
    "The new software update fixed several bugs.",
    "A dog is running across the sandy beach.",
    "The price of coffee went up again this year.",
    "Turn left at the second traffic light.",
    "The concert tickets sold out in minutes.",
    "My grandmother bakes bread every Sunday.",
    "The airport shuttle leaves every half hour.",
    "Scientists discovered a new species of frog.",
    "The library has a large collection of maps.",
    "Remember to water the plants twice a week.",
];

/// The timed calls of one case: the best and the median call (s), and
/// the profile of all of them (zeros without the `profile` feature).
struct Timing {
    best: f64,
    median: f64,
    mean: f64,
    parts: [Duration; Part::ALL.len()],
}

fn time(model: &Model, batch: &[Encoded], budget: Duration) -> Timing {
    for _ in 0..3 {
        std::hint::black_box(model.embed(batch, true));
    }
    // The warm-up's time is not the profile's.
    profile::take();
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < budget || samples.len() < 10 {
        let t = Instant::now();
        std::hint::black_box(model.embed(batch, true));
        samples.push(t.elapsed().as_secs_f64());
    }
    let parts = profile::take();
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    samples.sort_by(f64::total_cmp);
    Timing {
        best: samples[0],
        median: samples[samples.len() / 2],
        mean,
        parts: parts.map(|d| d / samples.len() as u32),
    }
}

/// The `--profile` table: per case, the mean pass and each part's share.
fn print_profile(cases: &[(usize, usize, usize, Timing)]) {
    print!(
        "\n{:>7} {:>5} {:>7} {:>9}",
        "threads", "batch", "tokens", "pass ms"
    );
    for part in Part::ALL {
        print!(" {:>12}", part.name());
    }
    println!(" {:>12}", "rest");
    for (threads, n, tokens, t) in cases {
        print!("{threads:>7} {n:>5} {tokens:>7} {:>9.3}", t.mean * 1e3);
        let share = |s: f64| format!("{:.1}%", 100.0 * s / t.mean);
        for d in t.parts {
            print!(" {:>12}", share(d.as_secs_f64()));
        }
        let counted: f64 = t.parts.iter().map(Duration::as_secs_f64).sum();
        println!(" {:>12}", share(t.mean - counted));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let profiling = args.iter().any(|a| a == "--profile");
    if profiling && !profile::ENABLED {
        eprintln!(
            "--profile needs a build with the profile feature: \
             cargo run --release -p m0-embed --features profile --example embed_bench -- --profile MODEL_DIR"
        );
        std::process::exit(EXIT_USAGE);
    }
    let mut args = args.into_iter().filter(|a| a != "--profile");
    let Some(dir) = args.next() else {
        eprintln!("usage: embed_bench [--profile] MODEL_DIR [SECONDS [THREADS [BATCH]]]");
        std::process::exit(EXIT_USAGE);
    };
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let only_threads: Option<usize> = args.next().and_then(|s| s.parse().ok());
    let only_batch: Option<usize> = args.next().and_then(|s| s.parse().ok());
    println!(
        "{:>7} {:>5} {:>7} {:>9} {:>9} {:>10} {:>10} {:>8} {:>9}",
        "threads",
        "batch",
        "tokens",
        "best ms",
        "med ms",
        "sent/s",
        "sent/s med",
        "GFLOP/s",
        "tok ms"
    );
    let mut profiled = Vec::new();
    for threads in [1, 2] {
        if only_threads.is_some_and(|t| t != threads) {
            continue;
        }
        let model = Model::load(
            dir.as_ref(),
            LoadOptions {
                threads,
                name: None,
                ..LoadOptions::default()
            },
        )
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(EXIT_REFUSED)
        });
        for n in [1usize, 4, 8, 32] {
            if only_batch.is_some_and(|b| b != n) {
                continue;
            }
            let texts = &SENTENCES[..n];
            let t = Instant::now();
            let batch = model.tokenize(texts, true).expect("tokenize");
            let tok_ms = t.elapsed().as_secs_f64() * 1e3;
            let tokens: usize = batch.iter().map(Encoded::tokens).sum();
            let t = time(&model, &batch, Duration::from_secs_f64(secs));
            let (best, med) = (t.best, t.median);
            println!(
                "{threads:>7} {n:>5} {tokens:>7} {:>9.3} {:>9.3} {:>10.1} {:>10.1} {:>8.1} {:>9.3}",
                best * 1e3,
                med * 1e3,
                n as f64 / best,
                n as f64 / med,
                model.dense_flops(tokens) / best / 1e9,
                tok_ms
            );
            if profiling {
                profiled.push((threads, n, tokens, t));
            }
        }
    }
    if profiling {
        print_profile(&profiled);
    }
}
