//! Parser for KFD `properties` files: one `key value` pair a line, decimal
//! unsigned values, keys in any order, unknown keys kept, missing keys allowed.

use std::path::Path;

use super::TopologyIssue;

/// The pairs of one `properties` file, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    pairs: Vec<(Box<str>, u64)>,
}

impl Properties {
    /// Parses `text`, read from `path`. A line that is not `key value` with a
    /// decimal `u64` value is skipped and reported in `issues`, naming the file
    /// and the line; the rest of the file still counts.
    pub fn parse(text: &str, path: &Path, issues: &mut Vec<TopologyIssue>) -> Self {
        let mut pairs = Vec::with_capacity(48);
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            match parse_line(line) {
                Ok((key, value)) => pairs.push((Box::from(key), value)),
                Err(reason) => issues.push(TopologyIssue::MalformedLine {
                    path: path.to_owned(),
                    line: number + 1,
                    text: truncate(line, 80),
                    reason,
                }),
            }
        }
        Self { pairs }
    }

    /// The value of `key`, or `None` when the file does not have it.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.pairs
            .iter()
            .find_map(|(k, v)| (k.as_ref() == key).then_some(*v))
    }

    /// The value of `key`, or 0 when absent (KFD prints 0 for "none").
    pub fn get_or_zero(&self, key: &str) -> u64 {
        self.get(key).unwrap_or(0)
    }

    /// Every pair, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.pairs.iter().map(|(k, v)| (k.as_ref(), *v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True when the file held no valid pair.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

fn parse_line(line: &str) -> Result<(&str, u64), &'static str> {
    let mut words = line.split_ascii_whitespace();
    let key = words.next().ok_or("empty line")?;
    let value = words.next().ok_or("key without a value")?;
    if words.next().is_some() {
        return Err("more than one value");
    }
    if !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err("key is not an identifier");
    }
    let value = value
        .parse::<u64>()
        .map_err(|_| "value is not an unsigned decimal number")?;
    Ok((key, value))
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> (Properties, Vec<TopologyIssue>) {
        let mut issues = Vec::new();
        let p = Properties::parse(text, Path::new("nodes/2/properties"), &mut issues);
        (p, issues)
    }

    #[test]
    fn reads_pairs_and_keeps_unknown_keys() {
        let (p, issues) = parse("simd_count 152\nhive_id 15188982192727901047\nnew_key 7\n");
        assert!(issues.is_empty());
        assert_eq!(p.get("simd_count"), Some(152));
        assert_eq!(p.get("hive_id"), Some(15_188_982_192_727_901_047));
        assert_eq!(p.get("new_key"), Some(7));
        assert_eq!(p.get("capability2"), None);
        assert_eq!(p.get_or_zero("capability2"), 0);
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn a_bad_line_is_reported_with_file_and_line_and_skipped() {
        let (p, issues) =
            parse("simd_count 152\nsimd_per_cu four\n\nwidth\nx y z\nfw_version -1\n");
        assert_eq!(p.get("simd_count"), Some(152));
        assert_eq!(p.get("simd_per_cu"), None);
        let text: Vec<String> = issues.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        assert!(text[0].contains("nodes/2/properties:2"), "{}", text[0]);
        assert!(text[0].contains("simd_per_cu four"), "{}", text[0]);
        assert!(text[1].contains(":4"), "{}", text[1]);
        assert!(text[3].contains("fw_version -1"), "{}", text[3]);
    }

    #[test]
    fn overflow_and_binary_garbage_do_not_panic() {
        let (p, issues) = parse("a 18446744073709551616\n\u{0}\u{ff} 1\nb 18446744073709551615");
        assert_eq!(p.get("a"), None);
        assert_eq!(p.get("b"), Some(u64::MAX));
        assert_eq!(issues.len(), 2);
    }

    #[test]
    fn long_lines_are_truncated_in_reports() {
        let line = format!("key {}", "9".repeat(300));
        let (_, issues) = parse(&line);
        assert!(issues[0].to_string().len() < 250);
    }
}
