// Slices are lists of CU ranges; a one-range slice is the common case here.
#![allow(clippy::single_range_in_vec_init)]

use super::*;

const UUID_A: &str = "GPU-c34ec50444dd0a6c";
const UUID_B: &str = "GPU-c34ec50444dd0a6d";

fn gpu(
    uuid: Option<&str>,
    kfd_node: u32,
    cus: Option<Vec<Range<u32>>>,
    mib: Option<u64>,
) -> GpuSlice {
    GpuSlice {
        rocr_uuid: uuid.map(str::to_owned),
        kfd_node,
        cu_count: 304,
        cus_per_wgp: 1,
        cus,
        memory_mib: mib,
    }
}

fn vars(env: &ContainerEnv) -> Vec<(&str, &str)> {
    env.vars
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect()
}

#[test]
fn one_gpu_at_25_percent_of_304_cus() {
    let want = super::super::cus_for_percent(304, 25);
    let cus = super::super::CuBitmap::new(UUID_A, 304)
        .choose(want, 1)
        .unwrap();
    let env = render_env(&[gpu(Some(UUID_A), 2, Some(cus), Some(16384))]).unwrap();
    assert_eq!(
        vars(&env),
        [
            ("ROCR_VISIBLE_DEVICES", UUID_A),
            ("HSA_CU_MASK", "0:0-75"),
            ("HIP_DEVICE_MEMORY_LIMIT", "16384m"),
            ("HIP_DEVICE_MEMORY_LIMIT_0", "16384m"),
        ]
    );
}

#[test]
fn two_gpus_with_different_slices_and_limits() {
    let env = render_env(&[
        gpu(Some(UUID_B), 3, Some(vec![76..152]), Some(8192)),
        gpu(Some(UUID_A), 2, Some(vec![0..4, 10..13, 8..9]), Some(4096)),
    ])
    .unwrap();
    assert_eq!(
        vars(&env),
        [
            (
                "ROCR_VISIBLE_DEVICES",
                "GPU-c34ec50444dd0a6d,GPU-c34ec50444dd0a6c"
            ),
            ("HSA_CU_MASK", "0:76-151;1:0-3,8,10-12"),
            ("HIP_DEVICE_MEMORY_LIMIT_0", "8192m"),
            ("HIP_DEVICE_MEMORY_LIMIT_1", "4096m"),
        ]
    );
}

#[test]
fn apu_without_uuid_makes_every_token_a_local_index() {
    // Annotation order: the APU (KFD node 5) first, then a dGPU (KFD node 1).
    // In the container's KFD enumeration the dGPU is 0 and the APU is 1.
    let mut apu = gpu(Some("GPU-XX"), 5, Some(vec![0..8]), None);
    apu.cu_count = 12;
    let env = render_env(&[apu, gpu(Some(UUID_A), 1, None, Some(1024))]).unwrap();
    assert_eq!(
        vars(&env),
        [
            ("ROCR_VISIBLE_DEVICES", "1,0"),
            ("HSA_CU_MASK", "0:0-7"),
            ("HIP_DEVICE_MEMORY_LIMIT_1", "1024m"),
        ]
    );
    let none = render_env(&[gpu(None, 7, None, None)]).unwrap();
    assert_eq!(vars(&none), [("ROCR_VISIBLE_DEVICES", "0")]);
}

#[test]
fn partitions_sharing_a_uuid_use_indices() {
    let env = render_env(&[
        gpu(Some(UUID_A), 4, None, None),
        gpu(Some(UUID_A), 3, None, None),
    ])
    .unwrap();
    assert_eq!(env.get("ROCR_VISIBLE_DEVICES"), Some("1,0"));
    let dup = render_env(&[gpu(None, 4, None, None), gpu(None, 4, None, None)]);
    assert_eq!(dup, Err(CuError::DuplicateKfdNode { node: 4 }));
}

#[test]
fn whole_gpu_request_has_no_mask() {
    let env = render_env(&[gpu(Some(UUID_A), 2, None, None)]).unwrap();
    assert_eq!(vars(&env), [("ROCR_VISIBLE_DEVICES", UUID_A)]);
    assert_eq!(env.get("HSA_CU_MASK"), None);
    let zero = render_env(&[gpu(Some(UUID_A), 2, None, Some(0))]).unwrap();
    assert_eq!(zero, env, "0 MiB means no limit");
}

#[test]
fn slices_that_do_not_fit_their_gpu_are_refused() {
    let mut wgp = gpu(Some(UUID_A), 2, Some(vec![2..5]), None);
    wgp.cus_per_wgp = 2;
    assert!(matches!(
        render_env(&[wgp.clone()]),
        Err(CuError::SplitWgp { cu: 4, .. })
    ));
    wgp.cus = Some(vec![1..4]);
    assert!(matches!(
        render_env(&[wgp.clone()]),
        Err(CuError::SplitWgp { cu: 1, .. })
    ));
    wgp.cus = Some(vec![2..4, 4..6]);
    assert_eq!(
        render_env(&[wgp]).unwrap().get("HSA_CU_MASK"),
        Some("0:2-5")
    );
    let cases = [Some(vec![]), Some(vec![3..3]), Some(vec![300..305])];
    for cus in cases {
        assert!(
            render_env(&[gpu(Some(UUID_A), 2, cus.clone(), None)]).is_err(),
            "{cus:?}"
        );
    }
    assert_eq!(render_env(&[]), Err(CuError::NoGpus));
}

mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::cu::{CuBitmap, mask::GpuShape};

    fn slice() -> impl Strategy<Value = (u32, u32, Vec<(u32, bool)>)> {
        (
            2..=304_u32,
            1..=2_u32,
            proptest::collection::vec((1..=80_u32, any::<bool>()), 0..5),
        )
    }

    proptest! {
        #[test]
        fn every_emitted_mask_parses_back_to_the_same_sets(
            gpus in proptest::collection::vec((slice(), any::<bool>()), 1..5),
        ) {
            let mut slices = Vec::new();
            for (i, ((total, unit, wants), sliced)) in (0u32..).zip(gpus) {
                let mut map = CuBitmap::new(i.to_string(), total);
                let mut cus = Vec::new();
                for (want, release) in wants {
                    if let Ok(ranges) = map.choose(want, unit) {
                        for r in &ranges {
                            map.claim(r.clone()).unwrap();
                        }
                        if release {
                            ranges.into_iter().for_each(|r| map.release(r).unwrap());
                        } else {
                            cus.extend(ranges);
                        }
                    }
                }
                let mut g = gpu(None, 10 - i, (sliced && !cus.is_empty()).then_some(cus), None);
                g.cu_count = total;
                g.cus_per_wgp = unit;
                slices.push(g);
            }
            let env = render_env(&slices).unwrap();
            let shapes: Vec<GpuShape> = slices
                .iter()
                .map(|g| GpuShape { cu_count: g.cu_count, cus_per_wgp: g.cus_per_wgp })
                .collect();
            let parsed = env.get("HSA_CU_MASK").map(|m| parse_cu_mask(m, &shapes).unwrap()).unwrap_or_default();
            for (i, g) in (0u32..).zip(&slices) {
                let want: Option<BTreeSet<u32>> = g.cus.as_ref().map(|c| c.iter().cloned().flatten().collect());
                prop_assert_eq!(parsed.get(&i).cloned(), want);
            }
        }
    }
}
