//! The private bus against the shipped policy. Needs root.

use super::*;

/// Prints why and returns false when not root.
pub(crate) fn root_or_skip(test: &str) -> bool {
    let root = effective_uid().unwrap() == 0;
    if !root {
        eprintln!("skipped {test}: needs root (setpriv, systemd-sysusers)");
    }
    root
}

fn start(policy: Policy) -> PrivateBus {
    ensure_plugin_user().unwrap();
    ensure_other_user().unwrap();
    PrivateBus::start(policy).unwrap()
}

const GET_ID: &[&str] = &[
    "call",
    "org.freedesktop.DBus",
    "/org/freedesktop/DBus",
    "org.freedesktop.DBus",
    "GetId",
];
const PING: &[&str] = &["call", BUS_NAME, "/", "org.freedesktop.DBus.Peer", "Ping"];

fn request_name(bus: &PrivateBus, uid: u32) -> RunOutput {
    let args = [
        "call",
        "org.freedesktop.DBus",
        "/org/freedesktop/DBus",
        "org.freedesktop.DBus",
        "RequestName",
        "su",
        BUS_NAME,
        "4",
    ];
    busctl(bus, uid, &args).unwrap()
}

fn assert_denied(out: &RunOutput, what: &str) {
    assert!(!out.success(), "{what} was allowed: {out:?}");
    assert!(out.stderr.contains("Access denied"), "{what}: {out:?}");
}

#[test]
fn driver_answers_root_and_plugin_and_policy_loads_cleanly() {
    if !root_or_skip("driver_answers_root_and_plugin_and_policy_loads_cleanly") {
        return;
    }
    let bus = start(Policy::Shipped);
    assert!(bus.address.starts_with("unix:path="), "{}", bus.address);
    for uid in [0, PLUGIN_UID, OTHER_UID] {
        let out = busctl(&bus, uid, GET_ID).unwrap();
        assert!(
            out.success() && out.stdout.starts_with("s \""),
            "uid {uid}: {out:?}"
        );
    }
    let log = bus.log().unwrap();
    assert_eq!(
        unexpected_log_lines(&log),
        "",
        "dbus-daemon complained:\n{log}"
    );
}

#[test]
fn only_root_may_own_the_name() {
    if !root_or_skip("only_root_may_own_the_name") {
        return;
    }
    let bus = start(Policy::Shipped);
    assert_denied(&request_name(&bus, OTHER_UID), "owning as OTHER_UID");
    assert_denied(&request_name(&bus, PLUGIN_UID), "owning as PLUGIN_UID");
    let root = request_name(&bus, 0);
    // 1 = DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER
    assert!(root.success() && root.stdout.trim() == "u 1", "{root:?}");
}

/// Issue 19: the plugin gets no Rescan (an AMD SMI probe each), no
/// RestoreCheck, and none of the standard calls it never makes.
fn plugin_is_refused_what_it_never_calls(bus: &PrivateBus) {
    let node = |member: &'static str| {
        [
            "call",
            BUS_NAME,
            "/io/hami/AmdGpu1",
            "io.hami.AmdGpu1.Node",
            member,
        ]
    };
    let set = [
        "call",
        BUS_NAME,
        "/io/hami/AmdGpu1",
        "org.freedesktop.DBus.Properties",
        "Set",
    ];
    let managed = [
        "call",
        BUS_NAME,
        "/io/hami/AmdGpu1",
        "org.freedesktop.DBus.ObjectManager",
        "GetManagedObjects",
    ];
    let introspect = ["introspect", BUS_NAME, "/io/hami/AmdGpu1"];
    let unlisted = ["call", BUS_NAME, "/", "io.hami.AmdGpu1.Debug", "Dump"];
    for args in [
        &node("Rescan")[..],
        &node("RestoreCheck")[..],
        PING,
        &set[..],
        &managed[..],
        &introspect[..],
        &unlisted[..],
    ] {
        assert_denied(
            &busctl(bus, PLUGIN_UID, args).unwrap(),
            &format!("plugin {args:?}"),
        );
    }
}

#[test]
fn shipped_policy_lets_root_and_plugin_call_and_refuses_others() {
    if !root_or_skip("shipped_policy_lets_root_and_plugin_call_and_refuses_others") {
        return;
    }
    let bus = start(Policy::Shipped);
    let holder = NameHolder::acquire(&bus, BUS_NAME).unwrap();
    let node = |member: &'static str| {
        [
            "call",
            BUS_NAME,
            "/io/hami/AmdGpu1",
            "io.hami.AmdGpu1.Node",
            member,
        ]
    };
    let get_all = [
        "call",
        BUS_NAME,
        "/io/hami/AmdGpu1/gpu/0000_05_00_0",
        "org.freedesktop.DBus.Properties",
        "GetAll",
        "s",
        "io.hami.AmdGpu1.Gpu",
    ];
    // Root may call anything; the plugin exactly the calls it makes.
    assert!(busctl(&bus, 0, PING).unwrap().success());
    assert!(busctl(&bus, 0, &node("Rescan")).unwrap().success());
    for args in [
        &node("SetPodVramLimits")[..],
        &node("SetComputePartition")[..],
        &node("GetUsage")[..],
        &get_all[..],
    ] {
        let out = busctl(&bus, PLUGIN_UID, args).unwrap();
        assert!(out.success(), "{args:?} as the plugin: {out:?}");
    }
    plugin_is_refused_what_it_never_calls(&bus);
    let introspect = ["introspect", BUS_NAME, "/io/hami/AmdGpu1"];
    assert_denied(&busctl(&bus, OTHER_UID, PING).unwrap(), "Ping as OTHER_UID");
    assert_denied(
        &busctl(&bus, OTHER_UID, &introspect).unwrap(),
        "introspect as OTHER",
    );
    let seen: Vec<(Option<String>, String)> = holder
        .calls()
        .into_iter()
        .map(|c| (c.interface, c.member))
        .collect();
    let call = |iface: &str, member: &str| (Some(iface.to_owned()), member.to_owned());
    let node_iface = "io.hami.AmdGpu1.Node";
    assert_eq!(
        seen,
        [
            call("org.freedesktop.DBus.Peer", "Ping"),
            call(node_iface, "Rescan"),
            call(node_iface, "SetPodVramLimits"),
            call(node_iface, "SetComputePartition"),
            call(node_iface, "GetUsage"),
            call("org.freedesktop.DBus.Properties", "GetAll"),
        ]
    );
}

#[test]
fn relaxed_policy_lets_other_uids_reach_the_service() {
    if !root_or_skip("relaxed_policy_lets_other_uids_reach_the_service") {
        return;
    }
    let bus = start(Policy::Relaxed);
    let holder = NameHolder::acquire(&bus, BUS_NAME).unwrap();
    let out = busctl(&bus, OTHER_UID, PING).unwrap();
    assert!(out.success(), "{out:?}");
    assert_eq!(holder.calls().len(), 1);
    // Ownership stays root's.
    assert_denied(&request_name(&bus, OTHER_UID), "owning as OTHER_UID");
}

#[test]
fn kill_stops_the_socket_accepting() {
    if !root_or_skip("kill_stops_the_socket_accepting") {
        return;
    }
    let mut bus = start(Policy::Shipped);
    assert!(UnixStream::connect(&bus.socket).is_ok());
    bus.kill();
    assert!(UnixStream::connect(&bus.socket).is_err());
    assert!(!busctl(&bus, 0, GET_ID).unwrap().success());
    bus.kill();
}

#[test]
fn restart_serves_the_same_socket_with_a_new_daemon() {
    if !root_or_skip("restart_serves_the_same_socket_with_a_new_daemon") {
        return;
    }
    let mut bus = start(Policy::Shipped);
    let (old_pid, old_address) = (bus.pid(), bus.address.clone());
    bus.restart().unwrap();
    assert_ne!(bus.pid(), old_pid);
    assert_ne!(bus.address, old_address, "a new daemon, a new GUID");
    assert!(bus.path_address().starts_with("unix:path="));
    assert!(busctl(&bus, 0, GET_ID).unwrap().success());
    bus.kill();
    assert!(UnixStream::connect(&bus.socket).is_err());
}

#[test]
fn relaxed_config_appends_the_allow_after_the_shipped_policy() {
    let socket = Path::new("/tmp/x/system_bus_socket");
    let shipped = bus_config(socket, Path::new("/a&b/p.conf"), Policy::Shipped);
    let relaxed = bus_config(socket, Path::new("/a&b/p.conf"), Policy::Relaxed);
    assert!(shipped.contains("<include>/a&amp;b/p.conf</include>"));
    assert!(!shipped.contains("<allow send_destination=\"io.hami.AmdGpu1\"/>"));
    let include = relaxed.find("<include>").unwrap();
    let allow = relaxed
        .find("<allow send_destination=\"io.hami.AmdGpu1\"/>")
        .unwrap();
    assert!(allow > include);
    let open = bus_config(socket, Path::new("/p.conf"), Policy::Unprivileged);
    let own = open.find("<allow own=\"io.hami.AmdGpu1\"/>").unwrap();
    assert!(own > open.find("<include>").unwrap());
}

#[test]
fn known_noise_is_filtered_from_the_log() {
    let log = "dbus-daemon[1]: [system] ...: Failed to set fd limit to 65536: EPERM\n\
               dbus[1]: Unknown username \"x\" in message bus configuration file\n";
    assert_eq!(
        unexpected_log_lines(log),
        "dbus[1]: Unknown username \"x\" in message bus configuration file\n"
    );
}
