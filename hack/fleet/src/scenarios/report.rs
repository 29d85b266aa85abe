//! The report of a run: sections printed as they are added, and rewritten after each one to
//! `<dir>/report.md` (Markdown tables) and `<dir>/report.json` (the same rows, typed), so a
//! run that fails later still leaves what it measured.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

/// A row of a report table: serialized as it is into `report.json`, rendered as cells into
/// `report.md`.
pub trait Row: Serialize {
    /// The row's Markdown cells, one per header column.
    fn cells(&self) -> Vec<String>;
}

/// `report.json`.
#[derive(Serialize)]
struct Document<'a> {
    sections: &'a [Section],
}

/// One section of `report.json` (a row's fields come in alphabetical order).
#[derive(Serialize)]
struct Section {
    title: String,
    /// The columns, for a table.
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<Vec<String>>,
    /// The rows of a table, or the section's value.
    data: Value,
}

/// Accumulates the report.
pub struct Report {
    markdown_path: PathBuf,
    json_path: PathBuf,
    markdown: String,
    sections: Vec<Section>,
}

impl Report {
    /// An empty report written into `dir`.
    pub fn new(dir: &Path) -> Report {
        Report {
            markdown_path: dir.join("report.md"),
            json_path: dir.join("report.json"),
            markdown: String::new(),
            sections: Vec::new(),
        }
    }

    /// Where the Markdown report is written.
    pub fn path(&self) -> &Path {
        &self.markdown_path
    }

    /// Adds a table of `rows` under `header`.
    pub fn table<R: Row>(&mut self, title: &str, header: &[impl AsRef<str>], rows: &[R]) {
        let header: Vec<String> = header.iter().map(|h| h.as_ref().to_owned()).collect();
        let body = markdown(&header, rows.iter().map(Row::cells));
        self.add(title, &body, Some(header), serde_json::to_value(rows).unwrap_or(Value::Null));
    }

    /// Adds a section whose Markdown `body` renders `data` (a table of other shape, or text).
    pub fn section(&mut self, title: &str, body: &str, data: &impl Serialize) {
        self.add(title, body, None, serde_json::to_value(data).unwrap_or(Value::Null));
    }

    fn add(&mut self, title: &str, body: &str, header: Option<Vec<String>>, data: Value) {
        let block = format!("\n### {title}\n\n{body}\n");
        println!("{block}");
        self.markdown.push_str(&block);
        self.sections.push(Section { title: title.to_owned(), header, data });
        let _ = std::fs::write(&self.markdown_path, &self.markdown);
        if let Ok(json) = serde_json::to_vec_pretty(&Document { sections: &self.sections }) {
            let _ = std::fs::write(&self.json_path, json);
        }
    }
}

/// A Markdown table from a header and rows of cells.
pub fn markdown(header: &[impl AsRef<str>], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let header: Vec<&str> = header.iter().map(AsRef::as_ref).collect();
    let mut out = format!("| {} |\n|{}\n", header.join(" | "), " --- |".repeat(header.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

/// Adds a measured row and logs it at once, so a run that fails later still shows it.
pub fn push_row<R: Row>(rows: &mut Vec<R>, what: &str, row: R) {
    eprintln!("  measured ({what}): {}", row.cells().join(" | "));
    rows.push(row);
}

/// One decimal.
pub fn f1(v: f64) -> String {
    format!("{v:.1}")
}

/// Two decimals.
pub fn f2(v: f64) -> String {
    format!("{v:.2}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Pair {
        name: &'static str,
        seconds: f64,
    }

    impl Row for Pair {
        fn cells(&self) -> Vec<String> {
            vec![self.name.to_owned(), f2(self.seconds)]
        }
    }

    #[test]
    fn a_table_is_written_as_markdown_and_as_typed_json() {
        let dir = std::env::temp_dir().join(format!("fleet-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut report = Report::new(&dir);
        report.table("Times", &["name", "s"], &[Pair { name: "a", seconds: 1.5 }]);
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert_eq!(md, "\n### Times\n\n| name | s |\n| --- | --- |\n| a | 1.50 |\n\n");
        let json: Value = serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"sections": [
                {"title": "Times", "header": ["name", "s"], "data": [{"name": "a", "seconds": 1.5}]}
            ]})
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
