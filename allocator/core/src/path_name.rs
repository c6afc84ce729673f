//! A file's path as heapscope prints it: in errors, titles and the app. A path is the user's bytes, and a recording
//! shared by someone else may carry any name: a newline in it would split an error message in two, an escape sequence
//! would reach the terminal. Control characters are written as Rust escapes (`\n`, `\t`, `\u{1b}`); every other
//! character as it is (a name that is not UTF-8 as `Path::display` shows it).

use std::path::Path;

/// `path` as printed: [`Path::display`] with every control character escaped.
pub fn path_name(path: &Path) -> String {
    let text = path.display().to_string();
    if !text.chars().any(char::is_control) {
        return text;
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_table() {
        // (the path, as printed)
        let cases = [
            ("trace.csv", "trace.csv"),
            ("runs/gpt 2 (copy).pickle", "runs/gpt 2 (copy).pickle"),
            ("bad\nname.csv", "bad\\nname.csv"),
            ("tab\there.csv", "tab\\there.csv"),
            ("red\u{1b}[31m.csv", "red\\u{1b}[31m.csv"),
            ("日本語.pickle", "日本語.pickle"),
        ];
        for (path, shown) in cases {
            assert_eq!(path_name(Path::new(path)), shown, "{path:?}");
        }
    }
}
