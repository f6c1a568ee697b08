//! Maximum bipartite matching (Kuhn's augmenting paths), used to prune the
//! GPU searches: if the checkpoint GPUs left cannot all be matched even one
//! pair at a time, no assignment exists below that point.

/// A maximum matching of `left` items onto `right` items where `edge(l, r)`
/// says whether `l` may take `r`. Returns, per left item, its right item.
pub fn max_matching(
    left: usize,
    right: usize,
    edge: impl Fn(usize, usize) -> bool,
) -> Vec<Option<usize>> {
    let adjacency: Vec<Vec<usize>> = (0..left)
        .map(|l| (0..right).filter(|&r| edge(l, r)).collect())
        .collect();
    let mut owner: Vec<Option<usize>> = vec![None; right];
    let mut seen = vec![false; right];
    for l in 0..left {
        seen.iter_mut().for_each(|s| *s = false);
        augment(l, &adjacency, &mut owner, &mut seen);
    }
    let mut of_left = vec![None; left];
    for (r, l) in owner.iter().enumerate() {
        if let Some(l) = l {
            of_left[*l] = Some(r);
        }
    }
    of_left
}

/// Whether every left item can be matched.
pub fn saturates_left(left: usize, right: usize, edge: impl Fn(usize, usize) -> bool) -> bool {
    left <= right && max_matching(left, right, edge).iter().all(Option::is_some)
}

/// Looks for an augmenting path from `l`, iteratively (no recursion depth
/// limit to worry about).
fn augment(
    start: usize,
    adjacency: &[Vec<usize>],
    owner: &mut [Option<usize>],
    seen: &mut [bool],
) -> bool {
    // Stack of (left item, next adjacency index to try, right item it came through).
    let mut stack: Vec<(usize, usize, Option<usize>)> = vec![(start, 0, None)];
    while let Some(top) = stack.last_mut() {
        let Some(&r) = adjacency[top.0].get(top.1) else {
            stack.pop();
            continue;
        };
        top.1 += 1;
        if seen[r] {
            continue;
        }
        seen[r] = true;
        match owner[r] {
            Some(holder) => stack.push((holder, 0, Some(r))),
            None => {
                // Flip the path: each left item on the stack takes the right
                // item the next one came through; the last takes `r`.
                let mut take = r;
                while let Some((l, _, came)) = stack.pop() {
                    owner[take] = Some(l);
                    match came {
                        Some(c) => take = c,
                        None => break,
                    }
                }
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_perfect_matching_that_greedy_would_miss() {
        // 0 may take 0 or 1, 1 only 0: greedy 0→0 blocks 1.
        let edges = [[true, true], [true, false]];
        let m = max_matching(2, 2, |l, r| edges[l][r]);
        assert_eq!(m, [Some(1), Some(0)]);
        assert!(saturates_left(2, 2, |l, r| edges[l][r]));
    }

    #[test]
    fn reports_what_cannot_be_matched() {
        // Both want only right item 0.
        let m = max_matching(2, 3, |_, r| r == 0);
        assert_eq!(m.iter().filter(|x| x.is_some()).count(), 1);
        assert!(!saturates_left(2, 3, |_, r| r == 0));
        assert!(!saturates_left(3, 2, |_, _| true));
        assert!(saturates_left(0, 0, |_, _| false));
    }

    #[test]
    fn long_augmenting_chains() {
        // l may take l and l+1; l = n-1 only takes 0 after everyone shifts.
        let n = 200;
        let edge = |l: usize, r: usize| r == l || r == l + 1 || (l == n - 1 && r == 0);
        assert!(saturates_left(n, n, edge));
        let m = max_matching(n, n, edge);
        let mut taken: Vec<usize> = m.iter().map(|x| x.unwrap()).collect();
        taken.sort_unstable();
        taken.dedup();
        assert_eq!(taken.len(), n);
    }
}
