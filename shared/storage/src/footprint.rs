//! Where an embedded store's bytes go: each redb table's entries and bytes, and what the file
//! holds beyond them (free and fragmented pages). `recollect bench` prints it per turn.

use std::path::Path;

use redb::{Database, ReadableTableMetadata, TableHandle};

use crate::StoreError;

/// One table of a redb file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TableFootprint {
    pub name: String,
    pub entries: u64,
    /// Keys and values as stored in leaf pages.
    pub stored_bytes: u64,
    /// B-tree bookkeeping plus the unused parts of the table's pages.
    pub overhead_bytes: u64,
}

/// A redb file: its tables, largest first, and its size on disk.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileFootprint {
    pub tables: Vec<TableFootprint>,
    pub file_bytes: u64,
}

/// Reads the footprint of the redb file at `path`, which no other process may have open.
pub fn redb_footprint(path: &Path) -> Result<FileFootprint, StoreError> {
    let file_bytes = std::fs::metadata(path)?.len();
    let db = Database::open(path)?;
    let r = db.begin_read()?;
    let mut tables = Vec::new();
    for handle in r.list_tables()? {
        let t = r.open_untyped_table(handle.clone())?;
        let s = t.stats()?;
        tables.push(TableFootprint {
            name: handle.name().to_string(),
            entries: t.len()?,
            stored_bytes: s.stored_bytes(),
            overhead_bytes: s.metadata_bytes() + s.fragmented_bytes(),
        });
    }
    tables.sort_by(|a, b| {
        (b.stored_bytes + b.overhead_bytes).cmp(&(a.stored_bytes + a.overhead_bytes))
    });
    Ok(FileFootprint { tables, file_bytes })
}
