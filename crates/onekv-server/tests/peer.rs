//! The `Peer` service: decoding never panics, and only messages for this node from members reach
//! the replica.

mod common;

use std::sync::Arc;

use common::FakeBackend;
use onekv_proto::{PeerMessages, peer_server::Peer};
use onekv_replica::Message;
use onekv_server::PeerService;
use proptest::prelude::*;
use protobuf::Message as _;
use raft::eraftpb::{Entry, MessageType};
use tonic::{Code, Request};

fn service() -> (Arc<FakeBackend>, PeerService<FakeBackend>) {
    let backend = Arc::new(FakeBackend::default());
    let config = common::three_node_config(std::path::Path::new("/unused"));
    (Arc::clone(&backend), PeerService::new(backend, &config))
}

fn message(from: u64, to: u64) -> Message {
    let mut message = Message::default();
    message.set_msg_type(MessageType::MsgAppend);
    message.from = from;
    message.to = to;
    message.term = 5;
    message.entries.push(Entry { index: 9, data: vec![1, 2, 3].into(), ..Entry::default() });
    message
}

fn encoded(message: &Message) -> Vec<u8> {
    message.write_to_bytes().unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn send(service: &PeerService<FakeBackend>, batch: PeerMessages) -> Result<(), tonic::Status> {
    runtime().block_on(service.send(Request::new(batch))).map(|_| ())
}

#[test]
fn valid_messages_are_stepped_in_order() {
    let (backend, service) = service();
    let first = message(2, 1);
    let mut second = message(2, 1);
    second.set_msg_type(MessageType::MsgHeartbeat);
    send(&service, PeerMessages { from: 2, messages: vec![encoded(&first), encoded(&second)] }).unwrap();
    let stepped = backend.stepped.lock().unwrap();
    assert_eq!(*stepped, vec![first, second]);
}

#[test]
fn garbage_is_invalid_argument_and_nothing_is_stepped() {
    let (backend, service) = service();
    // A valid message followed by garbage: the whole batch is refused.
    let batch = PeerMessages { from: 2, messages: vec![encoded(&message(2, 1)), vec![0xff; 7]] };
    let status = send(&service, batch).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("message 1 from node 2 does not decode"), "{}", status.message());
    assert!(backend.stepped.lock().unwrap().is_empty());
}

#[test]
fn a_message_for_another_node_is_refused() {
    let (backend, service) = service();
    let status =
        send(&service, PeerMessages { from: 2, messages: vec![encoded(&message(2, 3))] }).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("addressed to node 3, but this is node 1"), "{}", status.message());
    assert!(backend.stepped.lock().unwrap().is_empty());
}

#[test]
fn a_sender_that_is_not_a_member_is_refused() {
    let (backend, service) = service();
    let status =
        send(&service, PeerMessages { from: 9, messages: vec![encoded(&message(9, 1))] }).unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("node 9 is not a member"), "{}", status.message());
    // A member's batch carrying a message from a non-member is refused too.
    let status =
        send(&service, PeerMessages { from: 2, messages: vec![encoded(&message(7, 1))] }).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("node 7, which is not a member"), "{}", status.message());
    assert!(backend.stepped.lock().unwrap().is_empty());
    // But a message from another member may travel in a batch from node 2: raft-rs forwards
    // MsgTransferLeader with `from` set to the transferee.
    send(&service, PeerMessages { from: 2, messages: vec![encoded(&message(3, 1))] }).unwrap();
    assert_eq!(backend.stepped.lock().unwrap().len(), 1);
}

#[test]
fn large_batches_are_decoded_too() {
    // Above the inline-decoding threshold, decoding moves to a blocking thread.
    let (backend, service) = service();
    let mut big = message(2, 1);
    big.entries[0].data = vec![7u8; 2 << 20].into();
    send(&service, PeerMessages { from: 2, messages: vec![encoded(&big)] }).unwrap();
    assert_eq!(backend.stepped.lock().unwrap()[0].entries[0].data.len(), 2 << 20);
    let status = send(&service, PeerMessages { from: 2, messages: vec![vec![0x0a; 3 << 20]] }).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic: they are refused or, if they happen to decode into a message for
    /// this node from the sender, stepped.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let (backend, service) = service();
        let result = send(&service, PeerMessages { from: 2, messages: vec![bytes] });
        let stepped = backend.stepped.lock().unwrap().len();
        match result {
            Ok(()) => prop_assert_eq!(stepped, 1),
            Err(status) => {
                prop_assert_eq!(status.code(), Code::InvalidArgument);
                prop_assert_eq!(stepped, 0);
            }
        }
    }

    /// Every single-byte change of a valid message is stepped or refused as invalid, never panics.
    #[test]
    fn mutated_messages_never_panic(position in 0usize..64, value in any::<u8>()) {
        let (backend, service) = service();
        let mut bytes = encoded(&message(2, 1));
        let position = position % bytes.len();
        bytes[position] = value;
        let result = send(&service, PeerMessages { from: 2, messages: vec![bytes] });
        let stepped = backend.stepped.lock().unwrap().len();
        match result {
            Ok(()) => prop_assert_eq!(stepped, 1),
            Err(status) => {
                prop_assert_eq!(status.code(), Code::InvalidArgument);
                prop_assert_eq!(stepped, 0);
            }
        }
    }
}
