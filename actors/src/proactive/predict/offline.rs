//! Cells to learn from and evaluate on, outside an engine: a facts trace (one JSON line per
//! executed cell, with the worker's [`CellFacts`]), or the training sequences themselves,
//! whose facts are then read from the code alone (names assigned, column labels subscripted,
//! CSV headers).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, BufRead};
use std::path::Path;

use pyvisor_protocol::messages::{CellFacts, ColumnSummary, ObjectSummary};
use serde::{Deserialize, Serialize};

use super::syntax::{assigned, imported, loaded_files, mutated, statements, subscript_labels};
use super::tokens::{tokenize, Kind};

/// One executed cell of a trace.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceCell {
    pub sequence: String,
    pub index: usize,
    pub code: String,
    /// `ok` or `error`.
    pub status: String,
    #[serde(default)]
    pub facts: CellFacts,
    #[serde(default)]
    pub duration_ms: f64,
}

impl TraceCell {
    /// Whether the cell ran without error.
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }
}

/// The repository a sequence comes from (`owner.repo`, the name's part before `--`).
pub fn repository(sequence: &str) -> &str {
    sequence.split("--").next().unwrap_or(sequence)
}

/// Reads cells from `path`: a folder of training sequences (with CSV headers from the
/// `data` folder beside it) or a facts trace.
pub fn load(path: &Path) -> io::Result<Vec<Vec<TraceCell>>> {
    if path.is_dir() {
        let data = path.parent().map(|p| p.join("data"));
        read_sequences(path, data.as_deref().filter(|d| d.is_dir()))
    } else {
        read_trace(path)
    }
}

/// Reads a facts trace, grouped by sequence in file order, each in cell order.
pub fn read_trace(path: &Path) -> io::Result<Vec<Vec<TraceCell>>> {
    let file = io::BufReader::new(std::fs::File::open(path)?);
    let mut sequences: Vec<Vec<TraceCell>> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for line in file.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let cell: TraceCell = serde_json::from_str(&line)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let slot = *at.entry(cell.sequence.clone()).or_insert_with(|| {
            sequences.push(Vec::new());
            sequences.len() - 1
        });
        sequences[slot].push(cell);
    }
    for cells in &mut sequences {
        cells.sort_by_key(|c| c.index);
    }
    Ok(sequences)
}

#[derive(Deserialize)]
struct SequenceFile {
    name: String,
    #[serde(default)]
    data: Vec<String>,
    cells: Vec<String>,
}

/// Reads a folder of training sequences as a trace whose facts come from the code (see
/// [`CodeFacts`]); CSV headers are read from `data` when given.
pub fn read_sequences(dir: &Path, data: Option<&Path>) -> io::Result<Vec<Vec<TraceCell>>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        let sequence: SequenceFile = serde_json::from_str(&text)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let headers: HashMap<String, Vec<String>> = sequence
            .data
            .iter()
            .filter_map(|f| Some((f.clone(), csv_header(&data?.join(f))?)))
            .collect();
        let mut facts = CodeFacts::new(headers);
        let cells = sequence
            .cells
            .iter()
            .enumerate()
            .map(|(index, code)| TraceCell {
                sequence: sequence.name.clone(),
                index,
                code: code.clone(),
                status: "ok".to_string(),
                facts: facts.cell(code),
                duration_ms: 0.0,
            })
            .collect();
        out.push(cells);
    }
    Ok(out)
}

/// The column labels of a CSV/TSV file's first line.
fn csv_header(path: &Path) -> Option<Vec<String>> {
    let file = std::fs::File::open(path).ok()?;
    let mut line = String::new();
    io::BufReader::new(file).read_line(&mut line).ok()?;
    let line = line.trim_end_matches(['\n', '\r']);
    let separator = [',', '\t', ';']
        .into_iter()
        .max_by_key(|s| line.matches(*s).count())
        .unwrap_or(',');
    Some(
        line.split(separator)
            .map(|l| l.trim().trim_matches('"').to_string())
            .filter(|l| !l.is_empty())
            .collect(),
    )
}

/// Stands in for the worker's facts when only code is known: every assigned name is a data
/// object of unknown kind, whose columns are the CSV header it was read from, those of the
/// object it was derived from, and the labels subscripted on it.
pub struct CodeFacts {
    headers: HashMap<String, Vec<String>>,
    columns: BTreeMap<String, Vec<String>>,
    modules: HashSet<String>,
}

impl CodeFacts {
    /// Facts for a sequence that can read the given CSV headers (file name to labels).
    pub fn new(headers: HashMap<String, Vec<String>>) -> CodeFacts {
        CodeFacts {
            headers,
            columns: BTreeMap::new(),
            modules: HashSet::new(),
        }
    }

    /// The facts of the next cell.
    pub fn cell(&mut self, code: &str) -> CellFacts {
        let Some(tokens) = tokenize(code) else {
            return CellFacts::default();
        };
        let modules = imported(&tokens);
        self.modules.extend(modules.iter().cloned());
        let binds: Vec<String> = assigned(&tokens);
        for statement in statements(&tokens) {
            // `x = y...` derives x from y: it starts with y's columns.
            if let [target, eq, source, ..] = statement {
                if target.kind == Kind::Name && eq.is_op("=") && source.kind == Kind::Name {
                    if let Some(cols) = self.columns.get(&source.text).cloned() {
                        self.columns.insert(target.text.clone(), cols);
                    }
                }
            }
        }
        for (name, file) in loaded_files(&tokens) {
            if let Some(header) = self.headers.get(&file) {
                self.columns.insert(name, header.clone());
            }
        }
        for (name, label) in subscript_labels(&tokens) {
            let cols = self.columns.entry(name).or_default();
            if !cols.contains(&label) {
                cols.push(label);
            }
        }
        let touched = mutated(&tokens);
        let objects: Vec<ObjectSummary> = binds
            .iter()
            .chain(&touched)
            .filter(|n| !self.modules.contains(*n))
            .map(|name| self.summary(name))
            .collect();
        let reads = tokens
            .iter()
            .filter(|t| t.kind == Kind::Name && self.columns.contains_key(&t.text))
            .map(|t| t.text.clone())
            .collect();
        CellFacts {
            reads,
            binds: binds.into_iter().chain(modules).collect(),
            touched: Some(touched),
            objects,
            ..CellFacts::default()
        }
    }

    fn summary(&self, name: &str) -> ObjectSummary {
        ObjectSummary {
            name: name.to_string(),
            kind: "?".to_string(),
            columns: self
                .columns
                .get(name)
                .into_iter()
                .flatten()
                .map(|label| ColumnSummary {
                    name: label.clone(),
                    label_is_str: true,
                    ..ColumnSummary::default()
                })
                .collect(),
            ..ObjectSummary::default()
        }
    }
}
