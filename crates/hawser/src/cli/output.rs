//! Output of the CLI commands: `-o table` (aligned columns for humans) or `-o json`.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// The `-o/--output` option, flattened into every command that prints something.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct OutputArg {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

pub fn print_json<T: Serialize + ?Sized>(value: &T) {
    // Serializing the API's own types cannot fail (no maps with non-string keys).
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("error: encode JSON output: {e}"),
    }
}

/// A table with a header row; columns are padded to their widest cell.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                let cell_width = |r: &Vec<String>| r.get(c).map_or(0, |s| s.chars().count());
                self.rows.iter().map(cell_width).max().unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[c] - cell.chars().count();
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// "-" for a missing value.
pub fn or_dash(v: Option<&str>) -> String {
    v.unwrap_or("-").to_string()
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long ago a unix-millisecond timestamp was, for humans: "3s", "5m", "2h", "4d".
pub fn ago(then_ms: u64, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(then_ms) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let mut t = Table::new(&["NAME", "SIZE"]);
        t.row(vec!["a-long-name".into(), "1 GiB".into()]);
        t.row(vec!["b".into(), "10 GiB".into()]);
        assert_eq!(
            t.render(),
            "NAME         SIZE\na-long-name  1 GiB\nb            10 GiB\n"
        );
    }

    #[test]
    fn ages() {
        assert_eq!(ago(1_000, 4_500), "3s");
        assert_eq!(ago(0, 600_000), "10m");
        assert_eq!(ago(5, 0), "0s");
        assert_eq!(ago(0, 3 * 86_400_000), "3d");
    }
}
