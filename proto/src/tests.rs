//! Descriptor self-check: the hand-written `.proto` files against the field
//! tables of `docs/kubelet-api.md` (§1.2, §3.2), which were compared with
//! upstream;
//! [`containerd`] does the same for the containerd subset.

mod containerd;

use std::{collections::BTreeSet, path::Path};

use protox::prost_reflect::prost_types::{DescriptorProto, FieldDescriptorProto};

use super::*;

/// (message, field, number, type, label) as in the doc's tables. Label is
/// "" for a singular scalar, "msg" for a singular message, "repeated",
/// "map", or "optional" for a proto3 `optional`.
type Row = (&'static str, &'static str, i32, &'static str, &'static str);

#[rustfmt::skip]
const DEVICE_PLUGIN_FIELDS: &[Row] = &[
    ("DevicePluginOptions", "pre_start_required", 1, "bool", ""),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, "bool", ""),
    ("RegisterRequest", "version", 1, "string", ""),
    ("RegisterRequest", "endpoint", 2, "string", ""),
    ("RegisterRequest", "resource_name", 3, "string", ""),
    ("RegisterRequest", "options", 4, "DevicePluginOptions", "msg"),
    ("ListAndWatchResponse", "devices", 1, "Device", "repeated"),
    ("TopologyInfo", "nodes", 1, "NUMANode", "repeated"),
    ("NUMANode", "ID", 1, "int64", ""),
    ("Device", "ID", 1, "string", ""),
    ("Device", "health", 2, "string", ""),
    ("Device", "topology", 3, "TopologyInfo", "msg"),
    ("PreStartContainerRequest", "devices_ids", 1, "string", "repeated"),
    ("PreferredAllocationRequest", "container_requests", 1, "ContainerPreferredAllocationRequest", "repeated"),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1, "string", "repeated"),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, "string", "repeated"),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, "int32", ""),
    ("PreferredAllocationResponse", "container_responses", 1, "ContainerPreferredAllocationResponse", "repeated"),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, "string", "repeated"),
    ("AllocateRequest", "container_requests", 1, "ContainerAllocateRequest", "repeated"),
    ("ContainerAllocateRequest", "devices_ids", 1, "string", "repeated"),
    ("CDIDevice", "name", 1, "string", ""),
    ("AllocateResponse", "container_responses", 1, "ContainerAllocateResponse", "repeated"),
    ("ContainerAllocateResponse", "envs", 1, "map<string,string>", "map"),
    ("ContainerAllocateResponse", "mounts", 2, "Mount", "repeated"),
    ("ContainerAllocateResponse", "devices", 3, "DeviceSpec", "repeated"),
    ("ContainerAllocateResponse", "annotations", 4, "map<string,string>", "map"),
    ("ContainerAllocateResponse", "cdi_devices", 5, "CDIDevice", "repeated"),
    ("Mount", "container_path", 1, "string", ""),
    ("Mount", "host_path", 2, "string", ""),
    ("Mount", "read_only", 3, "bool", ""),
    ("DeviceSpec", "container_path", 1, "string", ""),
    ("DeviceSpec", "host_path", 2, "string", ""),
    ("DeviceSpec", "permissions", 3, "string", ""),
];

/// Messages with no fields at all.
const DEVICE_PLUGIN_EMPTY: &[&str] = &["Empty", "PreStartContainerResponse"];

/// (service, method, input, output, server-streaming).
type Rpc = (&'static str, &'static str, &'static str, &'static str, bool);

#[rustfmt::skip]
const DEVICE_PLUGIN_RPCS: &[Rpc] = &[
    ("Registration", "Register", "RegisterRequest", "Empty", false),
    ("DevicePlugin", "GetDevicePluginOptions", "Empty", "DevicePluginOptions", false),
    ("DevicePlugin", "ListAndWatch", "Empty", "ListAndWatchResponse", true),
    ("DevicePlugin", "GetPreferredAllocation", "PreferredAllocationRequest", "PreferredAllocationResponse", false),
    ("DevicePlugin", "Allocate", "AllocateRequest", "AllocateResponse", false),
    ("DevicePlugin", "PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse", false),
];

#[rustfmt::skip]
const POD_RESOURCES_FIELDS: &[Row] = &[
    ("ListPodResourcesResponse", "pod_resources", 1, "PodResources", "repeated"),
    ("AllocatableResourcesResponse", "devices", 1, "ContainerDevices", "repeated"),
    ("AllocatableResourcesResponse", "cpu_ids", 2, "int64", "repeated"),
    ("AllocatableResourcesResponse", "memory", 3, "ContainerMemory", "repeated"),
    ("GetPodResourcesRequest", "pod_name", 1, "string", ""),
    ("GetPodResourcesRequest", "pod_namespace", 2, "string", ""),
    ("GetPodResourcesResponse", "pod_resources", 1, "PodResources", "msg"),
    ("PodResources", "name", 1, "string", ""),
    ("PodResources", "namespace", 2, "string", ""),
    ("PodResources", "containers", 3, "ContainerResources", "repeated"),
    ("PodResources", "cpu_ids", 4, "int64", "repeated"),
    ("PodResources", "memory", 5, "ContainerMemory", "repeated"),
    ("ContainerResources", "name", 1, "string", ""),
    ("ContainerResources", "devices", 2, "ContainerDevices", "repeated"),
    ("ContainerResources", "cpu_ids", 3, "int64", "repeated"),
    ("ContainerResources", "memory", 4, "ContainerMemory", "repeated"),
    ("ContainerResources", "dynamic_resources", 5, "DynamicResource", "repeated"),
    ("ContainerMemory", "memory_type", 1, "string", ""),
    ("ContainerMemory", "size", 2, "uint64", ""),
    ("ContainerMemory", "topology", 3, "TopologyInfo", "msg"),
    ("ContainerDevices", "resource_name", 1, "string", ""),
    ("ContainerDevices", "device_ids", 2, "string", "repeated"),
    ("ContainerDevices", "topology", 3, "TopologyInfo", "msg"),
    ("TopologyInfo", "nodes", 1, "NUMANode", "repeated"),
    ("NUMANode", "ID", 1, "int64", ""),
    ("DynamicResource", "claim_name", 2, "string", ""),
    ("DynamicResource", "claim_namespace", 3, "string", ""),
    ("DynamicResource", "claim_resources", 4, "ClaimResource", "repeated"),
    ("ClaimResource", "cdi_devices", 1, "CDIDevice", "repeated"),
    ("ClaimResource", "driver_name", 2, "string", ""),
    ("ClaimResource", "pool_name", 3, "string", ""),
    ("ClaimResource", "device_name", 4, "string", ""),
    ("ClaimResource", "share_id", 5, "string", "optional"),
    ("CDIDevice", "name", 1, "string", ""),
];

const POD_RESOURCES_EMPTY: &[&str] = &["ListPodResourcesRequest", "AllocatableResourcesRequest"];

#[rustfmt::skip]
const POD_RESOURCES_RPCS: &[Rpc] = &[
    ("PodResourcesLister", "List", "ListPodResourcesRequest", "ListPodResourcesResponse", false),
    ("PodResourcesLister", "GetAllocatableResources", "AllocatableResourcesRequest", "AllocatableResourcesResponse", false),
    ("PodResourcesLister", "Get", "GetPodResourcesRequest", "GetPodResourcesResponse", false),
];

/// What one `.proto` file declares, flattened into comparable rows.
#[derive(Debug, Default)]
struct Declared {
    package: String,
    fields: BTreeSet<(String, String, i32, String, String)>,
    messages: BTreeSet<String>,
    rpcs: BTreeSet<(String, String, String, String, bool)>,
    /// Field numbers marked `reserved`, as (message, start, end-exclusive).
    reserved: BTreeSet<(String, i32, i32)>,
    /// The files it imports.
    imports: Vec<String>,
}

/// Compiles `file` (relative to `proto/`) with protox, as build.rs does.
fn declared(file: &str) -> Declared {
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let fds = protox::compile([file], [&include]).expect("protos compile");
    let fd = fds
        .file
        .iter()
        .find(|f| f.name() == file)
        .expect("compiled file is in the set");
    assert_eq!(fd.syntax(), "proto3", "{file}");
    let prefix = format!(".{}.", fd.package());
    let local = |name: &str| name.strip_prefix(&prefix).unwrap_or(name).to_owned();
    let mut out = Declared {
        package: fd.package().to_owned(),
        imports: fd.dependency.clone(),
        ..Declared::default()
    };
    for msg in &fd.message_type {
        out.messages.insert(msg.name().to_owned());
        for range in &msg.reserved_range {
            let row = (msg.name().to_owned(), range.start(), range.end());
            out.reserved.insert(row);
        }
        for field in &msg.field {
            let (ty, label) = type_and_label(msg, field, &local);
            let row = (
                msg.name().to_owned(),
                field.name().to_owned(),
                field.number(),
            );
            out.fields
                .insert((row.0, row.1, row.2, ty, label.to_owned()));
        }
    }
    for service in &fd.service {
        for method in &service.method {
            assert!(!method.client_streaming(), "{}", method.name());
            out.rpcs.insert((
                service.name().to_owned(),
                method.name().to_owned(),
                local(method.input_type()),
                local(method.output_type()),
                method.server_streaming(),
            ));
        }
    }
    out
}

/// The doc's Type and Label columns for `field` of `msg`.
fn type_and_label(
    msg: &DescriptorProto,
    field: &FieldDescriptorProto,
    local: &dyn Fn(&str) -> String,
) -> (String, &'static str) {
    let scalar = |f: &FieldDescriptorProto| {
        let name = f.r#type().as_str_name();
        name.trim_start_matches("TYPE_").to_lowercase()
    };
    let map_entry = msg.nested_type.iter().find(|n| {
        n.options.as_ref().is_some_and(|o| o.map_entry())
            && field.type_name().ends_with(&format!(".{}", n.name()))
    });
    let message = scalar(field) == "message";
    let ty = if message {
        local(field.type_name())
    } else {
        scalar(field)
    };
    if let Some(entry) = map_entry {
        let kv: Vec<String> = entry.field.iter().map(scalar).collect();
        (format!("map<{}>", kv.join(",")), "map")
    } else if field.label().as_str_name() == "LABEL_REPEATED" {
        (ty, "repeated")
    } else if message {
        (ty, "msg")
    } else if field.proto3_optional() {
        (ty, "optional")
    } else {
        (ty, "")
    }
}

/// Asserts `declared` matches the expected tables exactly, naming every
/// missing and unexpected row.
fn assert_matches(declared: &Declared, fields: &[Row], empty: &[&str], rpcs: &[Rpc]) {
    let want_fields: BTreeSet<_> = fields
        .iter()
        .map(|&(m, f, n, t, l)| (m.to_owned(), f.to_owned(), n, t.to_owned(), l.to_owned()))
        .collect();
    let missing: Vec<_> = want_fields.difference(&declared.fields).collect();
    let extra: Vec<_> = declared.fields.difference(&want_fields).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:#?}\nextra {extra:#?}"
    );

    let want_messages: BTreeSet<String> = fields
        .iter()
        .map(|row| row.0)
        .chain(empty.iter().copied())
        .map(str::to_owned)
        .collect();
    assert_eq!(declared.messages, want_messages);

    let want_rpcs: BTreeSet<_> = rpcs
        .iter()
        .map(|&(s, m, i, o, st)| (s.to_owned(), m.to_owned(), i.to_owned(), o.to_owned(), st))
        .collect();
    assert_eq!(declared.rpcs, want_rpcs);
}

#[test]
fn device_plugin_proto_matches_the_wire_contract() {
    let declared = declared("deviceplugin/v1beta1/api.proto");
    assert_eq!(declared.package, VERSION);
    assert!(declared.imports.is_empty(), "{:?}", declared.imports);
    assert_matches(
        &declared,
        DEVICE_PLUGIN_FIELDS,
        DEVICE_PLUGIN_EMPTY,
        DEVICE_PLUGIN_RPCS,
    );
    assert!(declared.reserved.is_empty(), "{:?}", declared.reserved);
}

#[test]
fn pod_resources_proto_matches_the_wire_contract() {
    let declared = declared("podresources/v1/api.proto");
    assert_eq!(declared.package, "v1");
    assert!(declared.imports.is_empty(), "{:?}", declared.imports);
    assert_matches(
        &declared,
        POD_RESOURCES_FIELDS,
        POD_RESOURCES_EMPTY,
        POD_RESOURCES_RPCS,
    );
    let reserved: Vec<_> = declared.reserved.iter().cloned().collect();
    assert_eq!(reserved, [("DynamicResource".to_owned(), 1, 2)]);
}

#[test]
fn generated_service_names_match_the_grpc_paths() {
    assert_eq!(
        v1beta1::registration_server::SERVICE_NAME,
        "v1beta1.Registration"
    );
    assert_eq!(
        v1beta1::device_plugin_server::SERVICE_NAME,
        "v1beta1.DevicePlugin"
    );
    assert_eq!(
        podresources::v1::pod_resources_lister_server::SERVICE_NAME,
        "v1.PodResourcesLister"
    );
}

#[test]
fn prost_encodes_as_the_doc_says() {
    use prost::Message;
    // docs/kubelet-api.md §1.4: an absent topology adds nothing, an empty one `1a 00`.
    let device = v1beta1::Device {
        id: "a".into(),
        health: HEALTHY.into(),
        topology: None,
    };
    let bytes = device.encode_to_vec();
    assert_eq!(bytes, b"\x0a\x01a\x12\x07Healthy");
    let with_empty = v1beta1::Device {
        topology: Some(v1beta1::TopologyInfo::default()),
        ..device
    };
    assert_eq!(with_empty.encode_to_vec()[bytes.len()..], [0x1a, 0x00]);
}

#[test]
fn constants() {
    assert_eq!(VERSION, "v1beta1");
    assert_eq!(
        (HEALTHY, UNHEALTHY, KUBELET_SOCKET),
        ("Healthy", "Unhealthy", "kubelet.sock")
    );
    assert_eq!(
        Path::new(DEFAULT_DEVICE_PLUGIN_DIR).join(KUBELET_SOCKET),
        Path::new("/var/lib/kubelet/device-plugins/kubelet.sock")
    );
    assert!(DEFAULT_POD_RESOURCES_SOCKET.ends_with("/pod-resources/kubelet.sock"));
}
