//! The eBPF programs' stack frames against the oldest verifier fsprof runs under (Debian's
//! 6.1 in the VM lab): it adds up the frames of every chain of BPF-to-BPF calls and
//! callbacks, each rounded up to 32 bytes, and refuses a chain over 512 ("combined stack
//! size of 3 calls is 544. Too large"). Only a VM boot found that before; this finds it
//! without root, from the built object.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use aya_obj::{Object, generated::bpf_insn};

/// The verifier's limit of a chain's frames and its rounding of each.
const MAX_STACK: u32 = 512;
const FRAME_ROUND: u32 = 32;

const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
const LD_IMM64: u8 = 0x18; // BPF_LD | BPF_IMM | BPF_DW
const PSEUDO_CALL: u8 = 1;
const PSEUDO_FUNC: u8 = 4;
const MOV64_X: u8 = 0xbf; // rX = rY
const ADD64_K: u8 = 0x07; // rX += imm
const FP: u8 = 10;

/// Where an instruction calls a subprogram (a call, or a callback's address taken).
fn callee(insns: &[bpf_insn], i: usize) -> Option<usize> {
    let insn = &insns[i];
    let pseudo = match insn.code {
        CALL => insn.src_reg() == PSEUDO_CALL,
        LD_IMM64 => insn.src_reg() == PSEUDO_FUNC,
        _ => false,
    };
    pseudo.then(|| (i as i64 + 1 + i64::from(insn.imm)) as usize)
}

/// Bytes of stack a run of instructions touches: the lowest offset from the frame pointer
/// it reads or writes, directly or through a register holding fp + offset.
fn frame_bytes(insns: &[bpf_insn]) -> u32 {
    let mut from_fp: [Option<i64>; 11] = [None; 11];
    let mut lowest = 0i64;
    for insn in insns {
        let (dst, src) = (insn.dst_reg() as usize, insn.src_reg() as usize);
        let class = insn.code & 0x07;
        // Loads (LDX) and stores (ST, STX) at r10 + off.
        let mem_fp = (class == 0x01 && src == FP as usize)
            || ((class == 0x02 || class == 0x03) && dst == FP as usize);
        if mem_fp {
            lowest = lowest.min(i64::from(insn.off));
        }
        match insn.code {
            // A call leaves r0-r5 to the callee.
            CALL => from_fp[..6].fill(None),
            MOV64_X if src == FP as usize && dst < 10 => from_fp[dst] = Some(0),
            ADD64_K if dst < 10 && from_fp[dst].is_some() => {
                let at = from_fp[dst].unwrap_or(0) + i64::from(insn.imm);
                from_fp[dst] = Some(at);
                lowest = lowest.min(at);
            }
            // Anything else that writes a register (not a store or a jump) ends its fp copy.
            _ if dst < 10 && ![0x02, 0x03, 0x05, 0x06].contains(&class) => {
                from_fp[dst] = None;
            }
            _ => {}
        }
    }
    (-lowest) as u32
}

/// Each subprogram of a linked program: its frame (rounded) and the subprograms it calls.
fn subprograms(insns: &[bpf_insn]) -> BTreeMap<usize, (u32, BTreeSet<usize>)> {
    let starts: BTreeSet<usize> = std::iter::once(0)
        .chain((0..insns.len()).filter_map(|i| callee(insns, i)))
        .collect();
    let bounds: Vec<usize> = starts.iter().copied().chain([insns.len()]).collect();
    bounds
        .windows(2)
        .map(|w| {
            let body = &insns[w[0]..w[1]];
            let frame = frame_bytes(body).max(1).div_ceil(FRAME_ROUND) * FRAME_ROUND;
            let calls = (w[0]..w[1]).filter_map(|i| callee(insns, i)).collect();
            (w[0], (frame, calls))
        })
        .collect()
}

/// The deepest chain from `at`: its bytes and the frames on it.
fn deepest(subs: &BTreeMap<usize, (u32, BTreeSet<usize>)>, at: usize) -> (u32, Vec<u32>) {
    let (frame, calls) = &subs[&at];
    let below = calls
        .iter()
        .filter(|&&c| c != at)
        .map(|&c| deepest(subs, c))
        .max_by_key(|(bytes, _)| *bytes)
        .unwrap_or_default();
    let mut frames = vec![*frame];
    frames.extend(below.1);
    (frame + below.0, frames)
}

#[test]
fn every_call_chain_fits_the_6_1_verifiers_stack() {
    let mut obj = Object::parse(super::EBPF_OBJECT).expect("the built eBPF object parses");
    let text: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    obj.relocate_calls(&text).expect("calls link");
    let mut checked = 0;
    for (name, p) in &obj.programs {
        let f = &obj.functions[&(p.section_index, p.address)];
        let (bytes, frames) = deepest(&subprograms(&f.instructions), 0);
        assert!(
            bytes <= MAX_STACK,
            "{name}: frames {frames:?} = {bytes} bytes, over Linux 6.1's {MAX_STACK}"
        );
        checked += 1;
    }
    assert!(checked >= 10, "{checked} programs");
}

#[test]
fn frames_are_measured_as_the_verifier_rounds_them() {
    let insn = |code: u8, dst: u8, src: u8, off: i16, imm: i32| bpf_insn {
        code,
        _bitfield_align_1: [],
        _bitfield_1: bpf_insn::new_bitfield_1(dst, src),
        off,
        imm,
    };
    // *(u64 *)(r10 - 8) = r1; r2 = r10; r2 += -40; exit
    let body = [
        insn(0x7b, FP, 1, -8, 0),
        insn(MOV64_X, 2, FP, 0, 0),
        insn(ADD64_K, 2, 0, 0, -40),
        insn(0x95, 0, 0, 0, 0),
    ];
    assert_eq!(frame_bytes(&body), 40);
    assert_eq!(subprograms(&body)[&0].0, 64);
    assert_eq!(frame_bytes(&body[3..]), 0);
    assert_eq!(subprograms(&body[3..])[&0].0, 32);
}
