//! The cluster map: which nodes hold each shard, and which replica is its primary.

use crate::ring::Ring;
use crate::slot::KeyHashing;
use crate::{MAX_REPLICAS, MAX_SHARDS, NodeId, PlacementError, ShardId};

/// One shard's replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlacement {
    /// The shard (`1..=count`).
    pub id: ShardId,
    /// The nodes holding a replica, distinct; `replicas[0]` is the primary (the preferred leader).
    pub replicas: Vec<NodeId>,
}

/// Where every shard lives, at one epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMap {
    /// Version of the map: 1 for a new cluster, + 1 at every change.
    pub epoch: u64,
    /// The member nodes, strictly ascending.
    pub nodes: Vec<NodeId>,
    /// Every shard, by id (`shards[i].id == i + 1`).
    pub shards: Vec<ShardPlacement>,
    /// How keys hash to slots ([`KeyHashing::DatabaseBlind`] from [`Self::build`]); a cluster keeps
    /// its rule for life (its maps carry it, and a node refuses a configuration that names another).
    pub key_hashing: KeyHashing,
}

impl ClusterMap {
    /// Placement for a new cluster (epoch 1) of `nodes` (any order), `shards` shards and `replicas`
    /// replicas per shard.
    ///
    /// Each shard walks the ring clockwise from its point for its order of candidate nodes; shards in
    /// id order take the first candidates that are under the bound `ceil(shards * replicas / nodes)`
    /// (and that keep the rest of the placement possible); then primaries are balanced among each
    /// shard's replicas. Deterministic: the same inputs give the same map on every machine and release.
    ///
    /// Errors: no nodes, node id 0, duplicate ids, `shards` 0 or above [`MAX_SHARDS`], `replicas` 0 or
    /// above the node count or [`MAX_REPLICAS`].
    pub fn build(nodes: &[NodeId], shards: u32, replicas: u32) -> Result<ClusterMap, PlacementError> {
        let nodes = sorted_members(nodes)?;
        if shards == 0 || shards > MAX_SHARDS {
            return Err(PlacementError::InvalidShardCount(shards));
        }
        if replicas == 0 || replicas > MAX_REPLICAS || replicas as usize > nodes.len() {
            return Err(PlacementError::InvalidReplicaCount { replicas, nodes: nodes.len() });
        }
        let (n, s, r) = (nodes.len(), shards as usize, replicas as usize);
        let ring = Ring::new(&nodes);
        // Remaining capacity of each node (by index in `nodes`).
        let mut room = vec![(s * r).div_ceil(n); n];
        let mut placed = Vec::with_capacity(s);
        for id in 1..=shards as u64 {
            let left = s - placed.len(); // shards still to place, this one included
            let candidates: Vec<usize> = ring.candidates(id).iter().map(|c| index_of(&nodes, *c)).collect();
            let chosen = choose_bounded(&candidates, &room, left, r);
            for &i in &chosen {
                room[i] -= 1;
            }
            placed.push(ShardPlacement { id, replicas: chosen.iter().map(|&i| nodes[i]).collect() });
        }
        balance_primaries(&nodes, &mut placed, &vec![true; s]);
        Ok(ClusterMap { epoch: 1, nodes, shards: placed, key_hashing: KeyHashing::default() })
    }

    /// Number of shards.
    pub fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    /// Replicas per shard (0 for a map without shards).
    pub fn replication_factor(&self) -> u32 {
        self.shards.first().map_or(0, |s| s.replicas.len() as u32)
    }

    /// The shard that owns `key`.
    pub fn shard_of_key(&self, key: &[u8]) -> ShardId {
        crate::shard_of_key(key, self.shard_count(), self.key_hashing)
    }

    /// The placement of shard `id`.
    pub fn shard(&self, id: ShardId) -> Option<&ShardPlacement> {
        let at = usize::try_from(id.checked_sub(1)?).ok()?;
        match self.shards.get(at) {
            Some(s) if s.id == id => Some(s),
            _ => self.shards.iter().find(|s| s.id == id),
        }
    }

    /// The shards with a replica on `node`, ascending.
    pub fn shards_of(&self, node: NodeId) -> Vec<ShardId> {
        self.shards.iter().filter(|s| s.replicas.contains(&node)).map(|s| s.id).collect()
    }

    /// The primary (preferred leader) of `shard`.
    pub fn primary(&self, shard: ShardId) -> Option<NodeId> {
        self.shard(shard).and_then(|s| s.replicas.first().copied())
    }

    /// Number of shards whose primary is `node`.
    pub fn primaries_of(&self, node: NodeId) -> usize {
        self.shards.iter().filter(|s| s.replicas.first() == Some(&node)).count()
    }

    /// The map after `node` joins: epoch + 1. The new node takes replicas from the most loaded nodes
    /// until no node holds more than one replica above it: from each donor, the shard where the new
    /// node ranks best in the shard's ring order (with the new node on the ring), taking the donor's
    /// place in the list. Then primaries are balanced using only the shards it joined. Every other
    /// shard keeps exactly its replica list; every changed shard differs by the new node replacing one
    /// old node.
    ///
    /// Errors: `node` is 0 or already a member, or `self` is not a valid map (see [`Self::validate`]).
    pub fn with_node_added(&self, node: NodeId) -> Result<ClusterMap, PlacementError> {
        self.validate()?;
        if node == 0 {
            return Err(PlacementError::ZeroNodeId);
        }
        let Err(at) = self.nodes.binary_search(&node) else {
            return Err(PlacementError::AlreadyMember(node));
        };
        let mut nodes = self.nodes.clone();
        nodes.insert(at, node);
        let ring = Ring::new(&nodes);
        // How early the new node comes in each shard's candidate order (lower is better).
        let rank: Vec<usize> = self
            .shards
            .iter()
            .map(|s| ring.candidates(s.id).iter().position(|&c| c == node).unwrap_or(usize::MAX))
            .collect();
        let mut shards = self.shards.clone();
        let mut load = vec![0usize; nodes.len()];
        for s in &shards {
            for &r in &s.replicas {
                load[index_of(&nodes, r)] += 1;
            }
        }
        let new = at;
        let mut joined = vec![false; shards.len()];
        loop {
            let mut donors: Vec<usize> = (0..nodes.len()).filter(|&i| i != new).collect();
            donors.sort_by_key(|&i| (std::cmp::Reverse(load[i]), i));
            let step = donors.into_iter().take_while(|&d| load[d] > load[new] + 1).find_map(|d| {
                let donor = nodes[d];
                (0..shards.len())
                    .filter(|&k| !joined[k] && shards[k].replicas.contains(&donor))
                    .min_by_key(|&k| (rank[k], k))
                    .map(|k| (d, k))
            });
            let Some((d, k)) = step else { break };
            let slot = shards[k].replicas.iter().position(|&r| r == nodes[d]).expect("donor holds the shard");
            shards[k].replicas[slot] = node;
            joined[k] = true;
            load[d] -= 1;
            load[new] += 1;
        }
        balance_primaries(&nodes, &mut shards, &joined);
        Ok(ClusterMap { epoch: self.epoch + 1, nodes, shards, key_hashing: self.key_hashing })
    }

    /// Checks everything [`Self::build`] guarantees about a map's shape: epoch ≥ 1; nodes non-empty,
    /// non-zero, strictly ascending; 1..=[`MAX_SHARDS`] shards with ids `1..=count` in order; every
    /// shard with the same number of replicas, in `1..=min(nodes, MAX_REPLICAS)`, distinct, all members.
    /// (Balance is not checked: it is a property of how a map was made, not of its validity.)
    pub fn validate(&self) -> Result<(), PlacementError> {
        if self.epoch == 0 {
            return Err(PlacementError::ZeroEpoch);
        }
        if self.nodes.is_empty() {
            return Err(PlacementError::NoNodes);
        }
        if self.nodes[0] == 0 {
            return Err(PlacementError::ZeroNodeId);
        }
        for (index, pair) in self.nodes.windows(2).enumerate() {
            if pair[0] >= pair[1] {
                return Err(PlacementError::NodesNotSorted {
                    index: index + 1,
                    previous: pair[0],
                    node: pair[1],
                });
            }
        }
        let count = u32::try_from(self.shards.len()).unwrap_or(u32::MAX);
        if count == 0 || count > MAX_SHARDS {
            return Err(PlacementError::InvalidShardCount(count));
        }
        let r = self.shards[0].replicas.len();
        if r == 0 || r > MAX_REPLICAS as usize || r > self.nodes.len() {
            return Err(PlacementError::InvalidReplicaCount {
                replicas: u32::try_from(r).unwrap_or(u32::MAX),
                nodes: self.nodes.len(),
            });
        }
        for (index, shard) in self.shards.iter().enumerate() {
            let expected = index as u64 + 1;
            if shard.id != expected {
                return Err(PlacementError::ShardOutOfOrder { index, id: shard.id, expected });
            }
            if shard.replicas.len() != r {
                return Err(PlacementError::ReplicaCountMismatch {
                    shard: shard.id,
                    count: shard.replicas.len(),
                    expected: r,
                });
            }
            for (i, &node) in shard.replicas.iter().enumerate() {
                if shard.replicas[..i].contains(&node) {
                    return Err(PlacementError::DuplicateReplica { shard: shard.id, node });
                }
                if self.nodes.binary_search(&node).is_err() {
                    return Err(PlacementError::UnknownReplica { shard: shard.id, node });
                }
            }
        }
        Ok(())
    }
}

/// `nodes` sorted, or the first error among: empty, id 0, duplicates.
fn sorted_members(nodes: &[NodeId]) -> Result<Vec<NodeId>, PlacementError> {
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    let mut sorted = nodes.to_vec();
    sorted.sort_unstable();
    if sorted[0] == 0 {
        return Err(PlacementError::ZeroNodeId);
    }
    if let Some(pair) = sorted.windows(2).find(|p| p[0] == p[1]) {
        return Err(PlacementError::DuplicateNode(pair[0]));
    }
    Ok(sorted)
}

fn index_of(nodes: &[NodeId], node: NodeId) -> usize {
    nodes.binary_search(&node).expect("a member node")
}

/// Picks `r` distinct nodes for one shard from `candidates` (node indexes in ring order), each with
/// room left, such that the `left - 1` shards after it can still be placed.
///
/// With `left` shards each needing `r` distinct nodes and node `i` able to take `room[i]` more, a
/// placement exists iff `Σ min(room[i], left) ≥ left·r` (the min cut of the complete bipartite flow
/// network). Choosing set T for this shard keeps that true iff the nodes with `room[i] ≥ left` left
/// out of T number at most `slack = Σ min(room[i], left) − left·r`: so a candidate of that kind is
/// always taken, and another only while enough picks remain for the rest of them.
fn choose_bounded(candidates: &[usize], room: &[usize], left: usize, r: usize) -> Vec<usize> {
    let full = |i: usize| room[i] >= left;
    let supply: usize = room.iter().map(|&c| c.min(left)).sum();
    let slack = supply.checked_sub(left * r).expect("bounded placement stays feasible");
    let mut unchosen_full = room.iter().filter(|&&c| c >= left).count();
    let mut chosen = Vec::with_capacity(r);
    for &c in candidates {
        if chosen.len() == r {
            break;
        }
        if room[c] == 0 {
            continue;
        }
        if full(c) {
            unchosen_full -= 1;
        } else if unchosen_full.saturating_sub(slack) > r - chosen.len() - 1 {
            continue;
        }
        chosen.push(c);
    }
    assert_eq!(chosen.len(), r, "bounded placement stays feasible");
    chosen
}

/// Balances primaries: moves primaries only within shards marked `movable`, along paths
/// `u ← s1 ← y1 ← s2 ← … ← y` (each node takes the primary of a shard it holds from the next), from a
/// node `u` with the fewest primaries to a node `y` with at least two more, until no such path exists.
/// The new primary is moved to the front of the replica list; the others keep their order.
fn balance_primaries(nodes: &[NodeId], shards: &mut [ShardPlacement], movable: &[bool]) {
    let n = nodes.len();
    let mut count = vec![0usize; n];
    let mut holds: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (k, s) in shards.iter().enumerate() {
        count[index_of(nodes, s.replicas[0])] += 1;
        if movable[k] {
            for &r in &s.replicas {
                holds[index_of(nodes, r)].push(k);
            }
        }
    }
    loop {
        let max = count.iter().copied().max().unwrap_or(0);
        let mut order: Vec<usize> = (0..n).filter(|&u| count[u] + 2 <= max).collect();
        order.sort_by_key(|&u| (count[u], u));
        let Some((u, parent, y)) = order.into_iter().find_map(|u| {
            let (parent, y) = improving_path(nodes, shards, &holds, &count, u)?;
            Some((u, parent, y))
        }) else {
            return;
        };
        let mut at = y;
        while at != u {
            let (taker, k) = parent[at].expect("on the path");
            let replicas = &mut shards[k].replicas;
            let i = replicas.iter().position(|&r| r == nodes[taker]).expect("taker holds the shard");
            let primary = replicas.remove(i);
            replicas.insert(0, primary);
            at = taker;
        }
        count[u] += 1;
        count[y] -= 1;
    }
}

/// Breadth-first search from `u` over "x can take the primary of shard k from y"; returns the parent
/// links and the reached node with the most primaries, if it has at least two more than `u`.
#[allow(clippy::type_complexity)]
fn improving_path(
    nodes: &[NodeId],
    shards: &[ShardPlacement],
    holds: &[Vec<usize>],
    count: &[usize],
    u: usize,
) -> Option<(Vec<Option<(usize, usize)>>, usize)> {
    let n = nodes.len();
    let mut parent: Vec<Option<(usize, usize)>> = vec![None; n];
    let mut seen = vec![false; n];
    seen[u] = true;
    let mut queue = std::collections::VecDeque::from([u]);
    let mut best: Option<usize> = None;
    while let Some(x) = queue.pop_front() {
        for &k in &holds[x] {
            let y = index_of(nodes, shards[k].replicas[0]);
            if seen[y] {
                continue;
            }
            seen[y] = true;
            parent[y] = Some((x, k));
            queue.push_back(y);
            if count[y] >= count[u] + 2 && best.is_none_or(|b| count[y] > count[b]) {
                best = Some(y);
            }
        }
    }
    best.map(|y| (parent, y))
}
