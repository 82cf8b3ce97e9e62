//! What a peer sends, on arbitrary bytes, through the very checks the peer service makes before
//! stepping anything (`onekv_server::peer::decode_batch`: the sender is a member; each raft-rs
//! message decodes, is addressed to this node and comes from a member). None may panic; whatever
//! is accepted must satisfy those checks.
//!
//! The first byte picks the input's shape: even, the rest is the body of a `Peer.Send` call,
//! decoded as `PeerMessages` with prost as tonic does; odd, the rest is one raft-rs message in a
//! batch from member 2, so the fuzzer reaches the message decoder without first learning the
//! outer framing.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use onekv_proto::PeerMessages;
use onekv_server::peer::decode_batch;
use prost::Message as _;

/// This node, in a cluster of members 1, 2 and 3.
const NODE_ID: u64 = 1;

fuzz_target!(|data: &[u8]| {
    let Some((&shape, rest)) = data.split_first() else { return };
    let batch = if shape % 2 == 0 {
        let Ok(batch) = PeerMessages::decode(rest) else { return };
        batch
    } else {
        PeerMessages { from: 2, messages: vec![rest.to_vec()], shards: vec![1] }
    };
    let members: HashSet<u64> = [1, 2, 3].into_iter().collect();
    if let Ok(messages) = decode_batch(&batch, NODE_ID, &members) {
        assert!(members.contains(&batch.from));
        assert_eq!(messages.len(), batch.messages.len());
        assert_eq!(batch.shards.len(), batch.messages.len());
        for ((shard, message), sent) in messages.iter().zip(&batch.shards) {
            assert_eq!(shard, sent);
            assert_eq!(message.to, NODE_ID);
            assert!(members.contains(&message.from));
        }
    }
});
