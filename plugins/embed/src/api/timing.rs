//! TEI's timing headers on an embedding reply: where a request's time went,
//! in whole milliseconds, as TEI writes them.

/// What one embedding request cost, in nanoseconds and in work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// From the request's arrival (the host queued it) to its forward pass
    /// starting, less its own tokenization: waiting for a handler thread
    /// and for the other requests of its batch.
    pub queue_ns: u64,
    /// Parsing and tokenizing its inputs.
    pub tokenization_ns: u64,
    /// The forward pass (or passes) its inputs went through.
    pub inference_ns: u64,
    /// From arrival to the reply being written.
    pub total_ns: u64,
    /// Characters (Unicode scalar values) of its texts, prompts included.
    pub characters: usize,
    /// Tokens of its inputs, special tokens included.
    pub tokens: usize,
}

/// What `x-compute-type` says: this server computes on the CPU.
pub const COMPUTE_TYPE: &str = "cpu";

impl Timing {
    /// The headers TEI sends with an embedding: `x-compute-type`,
    /// `x-compute-time` (TEI's is the total), `x-compute-characters`,
    /// `x-compute-tokens`, `x-total-time`, `x-tokenization-time`,
    /// `x-queue-time`, `x-inference-time`; times in whole milliseconds,
    /// rounded down.
    pub fn headers(&self) -> [(&'static str, String); 8] {
        let ms = |ns: u64| (ns / 1_000_000).to_string();
        [
            ("x-compute-type", COMPUTE_TYPE.to_string()),
            ("x-compute-time", ms(self.total_ns)),
            ("x-compute-characters", self.characters.to_string()),
            ("x-compute-tokens", self.tokens.to_string()),
            ("x-total-time", ms(self.total_ns)),
            ("x-tokenization-time", ms(self.tokenization_ns)),
            ("x-queue-time", ms(self.queue_ns)),
            ("x-inference-time", ms(self.inference_ns)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_rounded_down_as_tei_writes_them() {
        let t = Timing {
            queue_ns: 2_999_999,
            tokenization_ns: 1_000_000,
            inference_ns: 12_345_678,
            total_ns: 17_000_001,
            characters: 11,
            tokens: 5,
        };
        let h = t.headers();
        let get = |k: &str| h.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("x-compute-type"), "cpu");
        assert_eq!(get("x-queue-time"), "2");
        assert_eq!(get("x-tokenization-time"), "1");
        assert_eq!(get("x-inference-time"), "12");
        assert_eq!(get("x-total-time"), "17");
        assert_eq!(get("x-compute-time"), "17");
        assert_eq!(get("x-compute-characters"), "11");
        assert_eq!(get("x-compute-tokens"), "5");
    }
}
