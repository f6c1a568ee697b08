use std::time::Duration;

use tokio::time::Instant;

use super::*;

const GRACE: Duration = Duration::from_secs(30);

fn denied() -> SessionError {
    SessionError::Bus(zbus::Error::FDO(Box::new(zbus::fdo::Error::AccessDenied(
        "Rejected send message".to_owned(),
    ))))
}

#[test]
fn each_failure_gets_the_cause_whose_fix_applies() {
    assert_eq!(
        Unreachable::classify(&denied(), 1000).kind(),
        "denied",
        "the bus's AccessDenied"
    );
    let gone = SessionError::Bus(zbus::Error::FDO(Box::new(
        zbus::fdo::Error::ServiceUnknown("no io.hami.AmdGpu1".to_owned()),
    )));
    assert_eq!(Unreachable::classify(&gone, 0), Unreachable::NotOnBus);
    let ours = SessionError::Api(ipc::ApiError::AccessDenied("UID 1000".to_owned()));
    assert_eq!(Unreachable::classify(&ours, 1000).kind(), "denied");
    let hung = SessionError::Timeout(Duration::from_secs(5));
    assert_eq!(
        Unreachable::classify(&hung, 0),
        Unreachable::Hung {
            waited: Duration::from_secs(5)
        }
    );
    let other = SessionError::Api(ipc::ApiError::Failed("disk on fire".to_owned()));
    assert_eq!(Unreachable::classify(&other, 0).kind(), "failed");
}

#[test]
fn the_message_names_the_uid_and_the_command_that_fixes_it() {
    let text = Unreachable::classify(&denied(), 1234).to_string();
    assert!(text.contains("UID 1234"), "{text}");
    assert!(text.contains("systemctl reload dbus"), "{text}");
    let text = Unreachable::NotOnBus.to_string();
    assert!(text.contains("systemctl enable --now amd-gpud"), "{text}");
    assert!(text.contains(ipc::BUS_NAME), "{text}");
}

#[test]
fn a_cause_is_said_once_after_the_grace_and_the_recovery_once() {
    let mut teller = Teller::default();
    let t0 = Instant::now();
    let down = Reach::Unreachable(Unreachable::NotOnBus);
    assert_eq!(teller.step(&Reach::Unknown, t0, GRACE), None);
    assert_eq!(teller.step(&down, t0, GRACE), None, "within the grace");
    assert_eq!(teller.due(GRACE), Some(t0 + GRACE));
    assert_eq!(
        teller.step(&down, t0 + GRACE, GRACE),
        Some(Said::Unreachable(Unreachable::NotOnBus))
    );
    assert_eq!(teller.step(&down, t0 + GRACE * 5, GRACE), None, "once");
    assert_eq!(teller.due(GRACE), None, "nothing left to wait for");
    let hung = Reach::Unreachable(Unreachable::Hung {
        waited: Duration::from_secs(5),
    });
    assert!(
        matches!(
            teller.step(&hung, t0 + GRACE * 6, GRACE),
            Some(Said::Unreachable(_))
        ),
        "another cause of the same outage is said at once"
    );
    assert_eq!(
        teller.step(&down, t0 + GRACE * 7, GRACE),
        None,
        "flapping back"
    );
    let later = t0 + GRACE * 8;
    assert_eq!(
        teller.step(&Reach::Connected, later, GRACE),
        Some(Said::Reachable)
    );
    assert_eq!(teller.step(&Reach::Connected, later, GRACE), None);
    assert_eq!(
        teller.step(&down, later, GRACE),
        None,
        "a new outage, a new grace"
    );
}

#[test]
fn a_short_outage_is_never_said() {
    let mut teller = Teller::default();
    let t0 = Instant::now();
    let down = Reach::Unreachable(Unreachable::NotOnBus);
    assert_eq!(teller.step(&down, t0, GRACE), None);
    assert_eq!(teller.step(&Reach::Connected, t0 + GRACE / 2, GRACE), None);
}
