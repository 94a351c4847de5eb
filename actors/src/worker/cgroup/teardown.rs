//! Removing an engine's parent groups together with every process still in them: the
//! engine's own when its manager is dropped, and at start those of engines that died without
//! cleaning up (SIGKILLed along with their janitor), so nothing they started lives on.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use super::{CgroupLeaf, CgroupMechanism, Hierarchy, PARENT_PREFIX};

/// Kills what is in the `pyvisor-<pid>-<n>` groups of engines that no longer run, and removes them.
pub(super) fn remove_stale_parents(mechanism: CgroupMechanism, hierarchies: &[Hierarchy]) {
    // `pyvisor-<pid>-<n>`, or `pyvisor-<pid>` as older engines named it.
    let pid_of = |name: &str| {
        let rest = name.strip_prefix(PARENT_PREFIX)?;
        let pid = rest.split_once('-').map_or(rest, |(pid, _)| pid);
        pid.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| pid.parse::<u32>().ok())?
    };
    let stale: BTreeSet<String> = hierarchies
        .iter()
        .flat_map(|h| crate::worker::left_by_dead_processes(&h.base, pid_of))
        .filter_map(|dir| Some(dir.file_name()?.to_str()?.to_owned()))
        .collect();
    for name in stale {
        tracing::info!("cleaning the cgroup {name} of an engine that is gone");
        remove_parent(mechanism, hierarchies, &name);
    }
}

/// Kills every process in parent group `name` (each leaf, then the group itself) in every
/// hierarchy, and removes the leaves and the group.
pub(super) fn remove_parent(mechanism: CgroupMechanism, hierarchies: &[Hierarchy], name: &str) {
    let parents: Vec<(PathBuf, &[&str])> = hierarchies
        .iter()
        .map(|h| (h.base.join(name), h.controllers.as_slice()))
        .filter(|(dir, _)| dir.is_dir())
        .collect();
    let leaves: BTreeSet<_> = parents
        .iter()
        .filter_map(|(dir, _)| fs::read_dir(dir).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.file_name())
        .collect();
    for leaf in leaves {
        let dirs = parents
            .iter()
            .map(|(dir, controllers)| (dir.join(&leaf), *controllers))
            .filter(|(dir, _)| dir.is_dir())
            .collect();
        // Dropping the leaf kills its processes and removes its dirs.
        drop(CgroupLeaf::new(mechanism, dirs, None, None));
    }
    drop(CgroupLeaf::new(mechanism, parents, None, None));
}
