//! The `edit_file` rule: replace one exact, unique piece of text.
//!
//! Pure: text in, text out. Exactly one occurrence of `old_text` must exist; none or several are
//! errors that tell the model how to fix its call, so an edit never lands in the wrong place.

use super::ToolError;

/// Replaces the single occurrence of `old_text` in `text` (a file named `requested`) by `new_text`.
pub(crate) fn replace_exactly(
    text: &str,
    requested: &str,
    old_text: &str,
    new_text: &str,
) -> Result<String, ToolError> {
    if old_text.is_empty() {
        return Err(ToolError::EmptyOldText);
    }
    let mut matches = text.match_indices(old_text);
    let Some((start, _)) = matches.next() else {
        return Err(ToolError::OldTextNotFound {
            requested: requested.to_owned(),
        });
    };
    let others = matches.count();
    if others > 0 {
        return Err(ToolError::OldTextAmbiguous {
            requested: requested.to_owned(),
            count: others + 1,
        });
    }
    let mut edited = String::with_capacity(text.len() - old_text.len() + new_text.len());
    edited.push_str(&text[..start]);
    edited.push_str(new_text);
    edited.push_str(&text[start + old_text.len()..]);
    Ok(edited)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_single_occurrence() {
        assert_eq!(
            replace_exactly("fn a() {}\nfn b() {}\n", "x.rs", "fn b", "fn c").unwrap(),
            "fn a() {}\nfn c() {}\n"
        );
        assert_eq!(replace_exactly("abc", "x", "abc", "").unwrap(), "");
    }

    #[test]
    fn missing_ambiguous_and_empty_are_errors() {
        assert_eq!(
            replace_exactly("aaa", "x.txt", "b", "c")
                .unwrap_err()
                .to_string(),
            "old_text was not found in x.txt; read the file and copy the exact text, including whitespace"
        );
        assert_eq!(
            replace_exactly("a a a", "x.txt", "a", "c")
                .unwrap_err()
                .to_string(),
            "old_text matches 3 places in x.txt; include more surrounding lines so it matches exactly one"
        );
        assert!(matches!(
            replace_exactly("a", "x", "", "c"),
            Err(ToolError::EmptyOldText)
        ));
    }
}
