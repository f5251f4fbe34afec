//! "Did you mean ...?": the names close to a misspelled one (an agent, a subcommand).
//!
//! Invariants: the distance is the optimal string alignment distance (Levenshtein with adjacent
//! transpositions: `cladue` is one step from `claude`), counted in characters; a name is
//! suggested only when it is at most [`MAX_DISTANCE`] steps away and fewer steps than the word
//! has characters (so `ab` never suggests `xy`), closest first, ties in the candidates' order.

/// The most edits between a word and a name it suggests.
pub const MAX_DISTANCE: usize = 2;

/// The optimal string alignment distance between `a` and `b`: insertions, deletions,
/// substitutions and transpositions of two adjacent characters, each one step.
#[must_use]
pub fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back (for transpositions), the last and the one being filled.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (last[j] + 1).min(row[j - 1] + 1).min(last[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            row[j] = best;
        }
        before = std::mem::replace(&mut last, row);
    }
    last[b.len()]
}

/// The candidates close enough to `word` to suggest, closest first (ties in the order given),
/// each once; a candidate equal to `word` is not a suggestion.
#[must_use]
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let length = word.chars().count();
    let mut close: Vec<(usize, &str)> = Vec::new();
    for candidate in candidates {
        let steps = distance(word, candidate);
        if steps > 0
            && steps <= MAX_DISTANCE
            && steps < length
            && !close.iter().any(|(_, seen)| *seen == candidate)
        {
            close.push((steps, candidate));
        }
    }
    close.sort_by_key(|(steps, _)| *steps);
    close.into_iter().map(|(_, name)| name).collect()
}

/// `did you mean a?` / `did you mean a or b?` / `did you mean a, b or c?` for the names given,
/// `None` for none.
#[must_use]
pub fn did_you_mean(names: &[&str]) -> Option<String> {
    let (last, rest) = names.split_last()?;
    Some(if rest.is_empty() {
        format!("did you mean {last}?")
    } else {
        format!("did you mean {} or {last}?", rest.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_edits_and_transpositions() {
        assert_eq!(distance("", ""), 0);
        assert_eq!(distance("run", "run"), 0);
        assert_eq!(distance("", "run"), 3);
        assert_eq!(distance("run", ""), 3);
        assert_eq!(distance("rn", "run"), 1);
        assert_eq!(distance("rnu", "run"), 1);
        assert_eq!(distance("cladue", "claude"), 1);
        assert_eq!(distance("codx", "codex"), 1);
        assert_eq!(distance("batch", "bacth"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("ca", "abc"), 3);
        assert_eq!(distance("agnets", "agents"), 1);
        assert_eq!(distance("é", "e"), 1);
    }

    #[test]
    fn closest_keeps_near_names_closest_first() {
        let names = ["claude", "claude-code", "codex", "gemini", "codex"];
        assert_eq!(closest("cladue", names), vec!["claude"]);
        assert_eq!(closest("codx", names), vec!["codex"]);
        assert_eq!(closest("claude", names), Vec::<&str>::new());
        assert_eq!(closest("zzz", names), Vec::<&str>::new());
        assert_eq!(closest("rn", ["run", "man", "sync"]), vec!["run"]);
        // Two edits of a two-letter word is any two-letter word: not a suggestion.
        assert_eq!(closest("xy", ["ab", "run"]), Vec::<&str>::new());
        assert_eq!(
            closest("sever", ["serve", "sync", "never"]),
            vec!["never", "serve"]
        );
        assert_eq!(closest("trst", ["trust", "test"]), vec!["trust", "test"]);
        assert_eq!(closest("tust", ["tests", "trust"]), vec!["trust", "tests"]);
    }

    #[test]
    fn did_you_mean_lists_the_names() {
        assert_eq!(did_you_mean(&[]), None);
        assert_eq!(did_you_mean(&["claude"]).unwrap(), "did you mean claude?");
        assert_eq!(did_you_mean(&["a", "b"]).unwrap(), "did you mean a or b?");
        assert_eq!(
            did_you_mean(&["a", "b", "c"]).unwrap(),
            "did you mean a, b or c?"
        );
    }
}
