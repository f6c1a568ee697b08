//! The containerd `.proto` subset against the numbers of
//! containerd/containerd:api/types/descriptor.proto,
//! api/services/images/v1/images.proto and api/services/content/v1/content.proto
//! (the revisions named in the crate's README).

use prost::Message;

use super::{Row, Rpc, assert_matches, declared};
use crate::containerd::services::{content::v1 as content, images::v1 as images};

#[rustfmt::skip]
const DESCRIPTOR_FIELDS: &[Row] = &[
    ("Descriptor", "media_type", 1, "string", ""),
    ("Descriptor", "digest", 2, "string", ""),
    ("Descriptor", "size", 3, "int64", ""),
    ("Descriptor", "annotations", 5, "map<string,string>", "map"),
];

#[rustfmt::skip]
const IMAGES_FIELDS: &[Row] = &[
    ("Image", "name", 1, "string", ""),
    ("Image", "labels", 2, "map<string,string>", "map"),
    ("Image", "target", 3, ".containerd.types.Descriptor", "msg"),
    ("GetImageRequest", "name", 1, "string", ""),
    ("GetImageResponse", "image", 1, "Image", "msg"),
];

#[rustfmt::skip]
const IMAGES_RPCS: &[Rpc] = &[
    ("Images", "Get", "GetImageRequest", "GetImageResponse", false),
];

#[rustfmt::skip]
const CONTENT_FIELDS: &[Row] = &[
    ("Info", "digest", 1, "string", ""),
    ("Info", "size", 2, "int64", ""),
    ("InfoRequest", "digest", 1, "string", ""),
    ("InfoResponse", "info", 1, "Info", "msg"),
    ("ReadContentRequest", "digest", 1, "string", ""),
    ("ReadContentRequest", "offset", 2, "int64", ""),
    ("ReadContentRequest", "size", 3, "int64", ""),
    ("ReadContentResponse", "offset", 1, "int64", ""),
    ("ReadContentResponse", "data", 2, "bytes", ""),
];

#[rustfmt::skip]
const CONTENT_RPCS: &[Rpc] = &[
    ("Content", "Info", "InfoRequest", "InfoResponse", false),
    ("Content", "Read", "ReadContentRequest", "ReadContentResponse", true),
];

#[test]
fn descriptor_proto_matches_the_wire_contract() {
    let declared = declared("containerd/types/descriptor.proto");
    assert_eq!(declared.package, "containerd.types");
    assert!(declared.imports.is_empty(), "{:?}", declared.imports);
    assert_matches(&declared, DESCRIPTOR_FIELDS, &[], &[]);
    assert!(declared.reserved.is_empty(), "{:?}", declared.reserved);
}

#[test]
fn images_proto_matches_the_wire_contract() {
    let declared = declared("containerd/services/images/v1/images.proto");
    assert_eq!(declared.package, "containerd.services.images.v1");
    assert_eq!(declared.imports, ["containerd/types/descriptor.proto"]);
    assert_matches(&declared, IMAGES_FIELDS, &[], IMAGES_RPCS);
    assert!(declared.reserved.is_empty(), "{:?}", declared.reserved);
}

#[test]
fn content_proto_matches_the_wire_contract() {
    let declared = declared("containerd/services/content/v1/content.proto");
    assert_eq!(declared.package, "containerd.services.content.v1");
    assert!(declared.imports.is_empty(), "{:?}", declared.imports);
    assert_matches(&declared, CONTENT_FIELDS, &[], CONTENT_RPCS);
    assert!(declared.reserved.is_empty(), "{:?}", declared.reserved);
}

#[test]
fn generated_containerd_service_names_match_the_grpc_paths() {
    assert_eq!(
        images::images_server::SERVICE_NAME,
        "containerd.services.images.v1.Images"
    );
    assert_eq!(
        content::content_server::SERVICE_NAME,
        "containerd.services.content.v1.Content"
    );
}

#[test]
fn upstream_fields_left_out_are_skipped_when_decoding() {
    // An Image as containerd sends it: name (1), target (3) with digest (2)
    // and size (3), then created_at (7), a Timestamp{seconds: 1}, which
    // this subset does not declare.
    let wire = b"\x0a\x01a\x1a\x0c\x12\x08sha256:x\x18\x2a\x3a\x02\x08\x01";
    let image = images::Image::decode(&wire[..]).expect("decodes");
    assert_eq!(image.name, "a");
    let target = image.target.expect("target");
    assert_eq!((target.digest.as_str(), target.size), ("sha256:x", 42));
    // An Info with size (2) 5 and labels (5) {"k": ""}.
    let info = content::Info::decode(&b"\x10\x05\x2a\x05\x0a\x01k\x12\x00"[..]);
    assert_eq!(info.expect("decodes").size, 5);
}

#[test]
fn read_request_encodes_as_upstream() {
    let request = content::ReadContentRequest {
        digest: "d".into(),
        offset: 3,
        size: 0,
    };
    assert_eq!(request.encode_to_vec(), b"\x0a\x01d\x10\x03");
}
