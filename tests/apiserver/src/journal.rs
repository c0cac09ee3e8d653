//! The store's state on disk, so the server keeps its objects across a
//! restart (even after `kill -9`) as kube-apiserver keeps them in etcd:
//! one JSON line per change in `store.jsonl` (an object written, or one
//! deleted, with the resourceVersion of the change), appended as it
//! happens, and now and then rewritten as one line per live object.
//! A line cut short by a crash, the last one, is ignored on reading.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::resources::{self, Resource};

/// An object's place in the store: group, plural, namespace, name.
pub type Key = (&'static str, &'static str, String, String);

/// What was on disk.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The last resourceVersion handed out.
    pub rv: u64,
    pub objects: BTreeMap<Key, Value>,
}

/// The open journal.
pub struct Journal {
    path: PathBuf,
    file: File,
    /// Lines in the file, to know when to rewrite it.
    lines: usize,
}

const FILE: &str = "store.jsonl";

fn resource_of(group: &str, plural: &str) -> Option<&'static Resource> {
    resources::RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)
}

fn key_json(key: &Key) -> Value {
    json!([key.0, key.1, key.2, key.3])
}

fn key_from(v: &Value) -> Option<Key> {
    let part = |i: usize| v.get(i).and_then(Value::as_str);
    let resource = resource_of(part(0)?, part(1)?)?;
    Some((
        resource.group,
        resource.plural,
        part(2)?.to_owned(),
        part(3)?.to_owned(),
    ))
}

impl Journal {
    /// Opens (or starts) the journal in `dir`, returning what it holds.
    pub fn open(dir: &Path) -> std::io::Result<(Self, Loaded)> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE);
        let mut loaded = Loaded::default();
        let mut lines = 0;
        if let Ok(file) = File::open(&path) {
            let all: Vec<String> = BufReader::new(file).lines().collect::<Result<_, _>>()?;
            let last = all.len().saturating_sub(1);
            for (i, line) in all.iter().enumerate() {
                let entry: Value = match serde_json::from_str(line) {
                    Ok(entry) => entry,
                    // Cut short by a crash mid-write: it was never acknowledged.
                    Err(_) if i == last => break,
                    Err(e) => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("{} line {}: {e}", path.display(), i + 1),
                        ));
                    }
                };
                lines += 1;
                if let Some(rv) = entry["rv"].as_u64() {
                    loaded.rv = loaded.rv.max(rv);
                }
                if let Some(key) = key_from(&entry["put"]) {
                    loaded.objects.insert(key, entry["object"].clone());
                } else if let Some(key) = key_from(&entry["delete"]) {
                    loaded.objects.remove(&key);
                }
            }
        }
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok((Self { path, file, lines }, loaded))
    }

    fn append(&mut self, entry: &Value) -> std::io::Result<()> {
        self.append_line(entry.to_string())
    }

    fn append_line(&mut self, mut line: String) -> std::io::Result<()> {
        line.push('\n');
        // One write per line: a crash loses at most the line being written.
        self.file.write_all(line.as_bytes())?;
        self.lines += 1;
        Ok(())
    }

    /// Records that `key` is now `object`, at resourceVersion `rv`.
    #[cfg(test)]
    pub fn put(&mut self, rv: u64, key: &Key, object: &Value) -> std::io::Result<()> {
        self.put_json(rv, key, &object.to_string())
    }

    /// Records that `key` is now `object`, written as JSON (the text a
    /// change's watchers are sent), at resourceVersion `rv`: no copy of the
    /// object is made to write it.
    pub fn put_json(&mut self, rv: u64, key: &Key, object: &str) -> std::io::Result<()> {
        let key = key_json(key);
        self.append_line(format!("{{\"rv\":{rv},\"put\":{key},\"object\":{object}}}"))
    }

    /// Records that `key` is gone, at resourceVersion `rv`.
    pub fn delete(&mut self, rv: u64, key: &Key) -> std::io::Result<()> {
        self.append(&json!({"rv": rv, "delete": key_json(key)}))
    }

    /// Records that resourceVersions now start after `rv`.
    pub fn resource_version(&mut self, rv: u64) -> std::io::Result<()> {
        self.append(&json!({"rv": rv}))
    }

    /// Whether the file has grown well past the live objects, so that
    /// [`Self::rewrite`] is worth its cost.
    pub fn wants_rewrite(&self, objects: usize) -> bool {
        self.lines > 4 * objects + 10_000
    }

    /// Replaces the file with one line per live object, atomically.
    pub fn rewrite(
        &mut self,
        rv: u64,
        objects: &BTreeMap<Key, std::sync::Arc<Value>>,
    ) -> std::io::Result<()> {
        let tmp = self.path.with_extension("jsonl.tmp");
        {
            let mut out = std::io::BufWriter::new(File::create(&tmp)?);
            writeln!(out, "{}", json!({"rv": rv}))?;
            for (key, object) in objects {
                writeln!(
                    out,
                    "{}",
                    json!({"rv": rv, "put": key_json(key), "object": **object})
                )?;
            }
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.lines = objects.len() + 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_key(name: &str) -> Key {
        ("", "nodes", String::new(), name.to_owned())
    }

    #[test]
    fn what_was_written_is_read_back_and_a_torn_last_line_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, loaded) = Journal::open(dir.path()).unwrap();
            assert_eq!(loaded.rv, 0);
            j.put(2, &node_key("a"), &json!({"metadata": {"name": "a"}}))
                .unwrap();
            j.put(3, &node_key("b"), &json!({"metadata": {"name": "b"}}))
                .unwrap();
            j.delete(4, &node_key("a")).unwrap();
        }
        let path = dir.path().join(FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"rv": 5, "put": ["", "nodes", "", "c"], "obj"#)
            .unwrap();
        let (_, loaded) = Journal::open(dir.path()).unwrap();
        assert_eq!(loaded.rv, 4);
        assert_eq!(
            loaded.objects.keys().cloned().collect::<Vec<_>>(),
            [node_key("b")]
        );
    }

    #[test]
    fn a_rewrite_keeps_the_live_objects_and_the_resource_version() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        let mut objects = BTreeMap::new();
        for i in 0..10 {
            let key = node_key(&format!("n{i}"));
            let object = json!({"metadata": {"name": key.3}});
            j.put(i + 2, &key, &object).unwrap();
            objects.insert(key, object);
        }
        objects.retain(|k, _| k.3 != "n3");
        j.delete(12, &node_key("n3")).unwrap();
        j.resource_version(1_000_012).unwrap();
        let shared = objects
            .iter()
            .map(|(k, v)| (k.clone(), std::sync::Arc::new(v.clone())))
            .collect();
        j.rewrite(1_000_012, &shared).unwrap();
        let (_, loaded) = Journal::open(dir.path()).unwrap();
        assert_eq!(loaded.rv, 1_000_012);
        assert_eq!(loaded.objects, objects);
    }
}
