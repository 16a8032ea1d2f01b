//! Times the forward pass: batch 1 and batch 32 of ~10-token sentences, on
//! 1 and 2 compute threads.
//!
//!     cargo run --release -p m0-embed --example embed_bench -- MODEL_DIR [SECONDS [THREADS [BATCH]]]
//!
//! THREADS and BATCH restrict the cases to one (for a profiler).
//! Prints, per case, the best and the median call (ms), sentences/s at the
//! best and the median, and GFLOP/s of the dense layers at the best.
//! Tokenizing is timed apart, once per case.

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

fn time(model: &Model, batch: &[Encoded], budget: Duration) -> (f64, f64) {
    for _ in 0..3 {
        std::hint::black_box(model.embed(batch, true));
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < budget || samples.len() < 10 {
        let t = Instant::now();
        std::hint::black_box(model.embed(batch, true));
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    (samples[0], samples[samples.len() / 2])
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: embed_bench MODEL_DIR [SECONDS per case]");
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
            let (best, med) = time(&model, &batch, Duration::from_secs_f64(secs));
            println!(
                "{threads:>7} {n:>5} {tokens:>7} {:>9.3} {:>9.3} {:>10.1} {:>10.1} {:>8.1} {:>9.3}",
                best * 1e3,
                med * 1e3,
                n as f64 / best,
                n as f64 / med,
                model.dense_flops(tokens) / best / 1e9,
                tok_ms
            );
        }
    }
}
