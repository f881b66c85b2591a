//! Writes grouped by memory node: a swap-out batch puts its pieces (spans,
//! or the members of several stripes) in one request per node, a vectored
//! write when there are several. A memory node's cost is per request (one
//! wake-up, one receive path) far more than per byte, so a batch of 32
//! spans over 7 nodes costs 7 requests, not 32.

use std::sync::Arc;

use remora_proto::msg::MemRequest;
use remora_proto::rpc::Ticket;
use remora_proto::{Cap, NodeId, Range, RpcError};

use crate::region_table::Link;

/// The pieces bound for one connection, each with the caller's tag.
pub(crate) struct NodeWrites<'a, T> {
    pub(crate) node: NodeId,
    pub(crate) link: Link,
    ranges: Vec<Range>,
    data: Vec<&'a [u8]>,
    pub(crate) tags: Vec<T>,
}

impl<'a, T> NodeWrites<'a, T> {
    /// Sends the pieces as one request: a plain write for one piece, a
    /// vectored write (all or nothing on the node) for several.
    pub(crate) fn send(&self) -> Result<Ticket, RpcError> {
        match (self.ranges.as_slice(), self.data.as_slice()) {
            ([r], [d]) => self.link.send_write(r.cap, r.offset, d),
            (ranges, data) => self.link.send(
                &MemRequest::WriteV {
                    ranges: ranges.to_vec(),
                },
                data,
            ),
        }
    }
}

/// Adds the piece `data` at `offset` of the region `cap` names, on `link`
/// (to `node`), to the batch for that connection.
pub(crate) fn add<'a, T>(
    batches: &mut Vec<NodeWrites<'a, T>>,
    (node, link): (NodeId, Link),
    cap: Cap,
    offset: u64,
    data: &'a [u8],
    tag: T,
) {
    let range = Range {
        cap,
        offset,
        len: data.len() as u32,
    };
    let b = match batches.iter().position(|b| Arc::ptr_eq(&b.link, &link)) {
        Some(i) => &mut batches[i],
        None => {
            batches.push(NodeWrites {
                node,
                link,
                ranges: Vec::new(),
                data: Vec::new(),
                tags: Vec::new(),
            });
            batches.last_mut().expect("just pushed")
        }
    };
    b.ranges.push(range);
    b.data.push(data);
    b.tags.push(tag);
}
