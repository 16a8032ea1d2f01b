//! From a cross-encoder's logits to the scores the routes answer: a
//! sigmoid for one label (a reranker's relevance), a softmax over several
//! (a classifier's), and the order results are listed in.

/// The logistic function, as sentence-transformers' CrossEncoder applies
/// it to a one-label model's logit (and TEI, and Cohere's
/// `relevance_score` in 0..1).
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The scores of one input's `logits`: raw when asked, else a sigmoid for
/// one label and a softmax over several, as TEI's `/predict` gives them.
pub fn activate(logits: &[f32], raw: bool) -> Vec<f32> {
    if raw {
        return logits.to_vec();
    }
    if let [one] = logits {
        return vec![sigmoid(*one)];
    }
    // Shifted by the largest, so no exp overflows.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// The indices of `scores`, highest score first; equal scores keep their
/// order (the sort is stable), so a reply is the same for the same inputs.
pub fn ranked(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_label_is_a_sigmoid_and_several_a_softmax() {
        assert_eq!(activate(&[0.0], false), [0.5]);
        assert_eq!(activate(&[2.5], true), [2.5]);
        let p = activate(&[1.0, 2.0, 3.0], false);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[2] > p[1] && p[1] > p[0]);
        // Large logits do not overflow.
        let p = activate(&[1000.0, 0.0], false);
        assert_eq!(p, [1.0, 0.0]);
        assert!((sigmoid(-3.0) - 0.047_425_873).abs() < 1e-7);
    }

    #[test]
    fn ranked_is_highest_first_and_stable() {
        assert_eq!(ranked(&[0.1, 0.9, 0.5, 0.9]), [1, 3, 2, 0]);
        assert_eq!(ranked(&[]), Vec::<usize>::new());
    }
}
