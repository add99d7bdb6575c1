//! A bounded map that keeps what was used recently, for caches read on hot paths (the
//! embedder's texts, the graph's decoded turn records).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// Two generations: lookups check `young` then `old` (promoting hits from `old`); when `young`
/// reaches `half` entries it becomes `old` and the previous `old` is dropped. Recently used
/// entries survive, the total stays at most twice `half`, and every operation is O(1).
#[derive(Debug)]
pub struct Generations<K, V> {
    young: HashMap<K, V>,
    old: HashMap<K, V>,
    half: usize,
}

impl<K: Eq + Hash, V: Clone> Generations<K, V> {
    /// At most `half` entries a generation (at least 1).
    pub fn new(half: usize) -> Self {
        Self {
            young: HashMap::new(),
            old: HashMap::new(),
            half: half.max(1),
        }
    }

    pub fn get<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        if let Some(v) = self.young.get(key) {
            return Some(v.clone());
        }
        let (key, v) = self.old.remove_entry(key)?;
        self.insert(key, v.clone());
        Some(v)
    }

    pub fn insert(&mut self, key: K, v: V) {
        if self.young.len() >= self.half && !self.young.contains_key(&key) {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, v);
    }

    pub fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    pub fn is_empty(&self) -> bool {
        self.young.is_empty() && self.old.is_empty()
    }

    pub fn clear(&mut self) {
        self.young.clear();
        self.old.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_entries_survive_a_rotation_and_the_total_is_bounded() {
        let mut g = Generations::new(2);
        g.insert("keep", 1);
        g.insert("a", 2);
        g.insert("b", 3); // rotates: old = {keep, a}, young = {b}
        assert_eq!(g.get("keep"), Some(1)); // promoted: young = {b, keep}
        g.insert("c", 4); // rotates: old = {b, keep}, young = {c}; "a" dropped
        assert_eq!(g.get("a"), None);
        assert_eq!(g.get("keep"), Some(1));
        assert!(g.len() <= 4);
        g.clear();
        assert!(g.is_empty());
    }
}
