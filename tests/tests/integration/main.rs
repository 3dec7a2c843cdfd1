//! fsprof's integration tests, one binary: real eBPF programs, real loop filesystems, real
//! workloads. Tests that need root (nearly all) are reported as ignored, not passed, when
//! run without it; `cargo xtask test` runs them as root, one at a time.

mod block;
mod busy;
mod cli;
mod crash;
mod history;
mod overhead;
mod reports;
mod root;
mod run;
mod sched;
mod stacks;
mod syscalls;
mod timeline;
mod vm;

use libtest_mimic::{Arguments, Trial};

/// `module::function` of each test, and whether it needs root.
macro_rules! tests {
    ($($root:ident $m:ident :: $f:ident),* $(,)?) => {
        vec![$((concat!(stringify!($m), "::", stringify!($f)), $m::$f as fn(), tests!(@$root))),*]
    };
    (@root) => { true };
    (@user) => { false };
}

fn main() {
    let all = tests![
        root block::loop_device_bytes_equal_sysfs_stat,
        root busy::trace_shows_a_neighbours_device_apart,
        root busy::another_filesystems_background_work_is_not_the_targets,
        root busy::trace_p_follows_the_busy_child_it_is_given,
        user cli::bad_input_gives_one_line_errors,
        root cli::missing_commands_and_filesystems_are_one_line_errors,
        root cli::json_output_has_schema_and_figures,
        root cli::exit_status_is_the_commands,
        root cli::sigterm_mid_run_leaves_nothing_behind,
        root cli::sigterm_before_the_command_starts_stops_it,
        root cli::cleanup_removes_what_a_killed_run_left,
        root cli::lab_options_reach_the_filesystem,
        root cli::list_agrees_with_the_kernel_and_the_path,
        root cli::readme_commands_run_as_written,
        root crash::shutdown_keeps_durable_updates_and_loses_uncommitted_ones,
        root crash::after_the_commit_interval_ext4_has_committed_the_rename,
        root crash::cost_pass_counts_the_syncs_each_pattern_makes,
        root crash::crash_studies_are_recorded_and_compared_with_their_past,
        root crash::a_filesystem_the_host_cannot_crash_is_a_one_line_error,
        root crash::sigint_mid_crash_study_leaves_nothing_and_a_partial_file,
        root history::runs_are_recorded_compared_with_their_past_and_trended,
        root history::two_machines_record_into_one_postgres_without_showing_its_password,
        user history::bad_stores_are_one_line_errors_and_the_results_stay,
        user history::a_results_file_survives_sigkill_mid_write,
        root overhead::probe_cost_is_reported_within_the_machines_kernel_time,
        root overhead::curated_events_count_as_the_census_does,
        root overhead::fs_events_follow_the_target_not_its_cwd,
        root overhead::fs_events_on_a_path_watch_only_its_filesystem,
        root overhead::own_run_counts_agree_with_the_kernels,
        root overhead::bpf_stats_end_with_fsprof_also_after_sigterm,
        root reports::html_report_renders_in_chromium,
        root reports::compare_flags_at_most_one_figure_of_a_rerun_and_an_injected_slowdown,
        root reports::identical_runs_flag_at_most_one_figure_and_data_journal_is_found,
        root reports::a_busier_machine_is_named_not_flagged,
        root reports::explain_names_io_wait_and_the_write_path_of_direct_io,
        root reports::broken_results_give_one_line_errors,
        root root::a_users_directory_of_decoy_links_is_refused,
        root root::work_directories_others_control_are_refused,
        root root::an_image_swapped_for_a_link_before_attach_is_harmless,
        root run::quick_suite_fills_every_cell,
        root run::workloads_write_exactly_their_specs,
        root run::capacity_matches_df,
        root run::sigint_mid_run_leaves_nothing_and_a_valid_partial_file,
        root run::devices_in_use_or_with_data_are_refused,
        root run::external_and_pgbench_steps_are_traced,
        root run::report_rerenders_results_and_rejects_broken_files,
        user run::bad_names_are_one_line_errors,
        root run::missing_mkfs_tools_are_one_line_errors,
        root run::a_failed_cell_does_not_stop_the_study,
        root run::the_seed_decides_the_tree,
        root run::jobs_run_at_once,
        root run::every_suite_at_tiny_scale_does_each_step,
        root run::quiesce_freezes_once_per_step_and_no_quiesce_never,
        root run::a_step_alone_gets_its_preparation_untraced,
        root run::a_run_on_ntfs_3g_fills_every_cell,
        root sched::wall_user_sys_agree_with_gnu_time,
        root sched::direct_io_writer_is_mostly_io_wait,
        root sched::cpu_bound_loop_is_on_cpu,
        root sched::a_running_process_is_traced_from_the_command_line,
        root sched::running_process_is_followed_with_pid,
        root sched::threads_left_running_are_read_at_one_instant,
        root stacks::cpu_bound_binary_hot_function_tops_on_cpu_graph,
        root stacks::own_programs_are_one_frame_and_named_as_the_kernel_names_them,
        root stacks::direct_io_off_cpu_is_io_wait_under_io_schedule,
        root stacks::pipe_and_child_waits_name_the_thread_that_woke_them,
        root stacks::xfs_delete_tree_waits_in_xfs_and_leaves_background_work,
        root stacks::fs_events_count_only_the_filesystem_under_test,
        root stacks::run_graphs_are_xml_named_by_cell_and_self_diff_is_neutral,
        root stacks::fuse_daemon_work_is_background_work,
        root stacks::user_stacks_are_whole_without_frame_pointers,
        root stacks::pprof_profiles_hold_the_folded_stacks,
        root timeline::thread_states_and_block_slices_match_the_trace,
        root timeline::off_cpu_stacks_on_the_timeline_add_up_to_the_time_classes,
        root syscalls::rm_rf_counts_equal_strace,
        root syscalls::children_and_threads_are_all_followed,
        root vm::two_kernel_run_fills_jfs_and_reiserfs_cells_and_compares_by_kernel,
        root vm::guest_syscall_counts_equal_strace_in_the_guest,
        root vm::power_cut_in_a_vm_crashes_btrfs,
        root vm::hung_crash_boot_is_booted_again_and_loses_no_trial,
        root vm::sigint_mid_vm_run_leaves_no_qemu,
        root vm::cleanup_stops_the_vm_of_a_killed_run,
        root vm::silent_guest_is_stopped_and_booted_again_once,
        root vm::kvm_that_cannot_boot_the_guest_is_one_line,
    ];
    let root = fsprof_tests::is_root();
    let skipped = all.iter().filter(|t| t.2 && !root).count();
    if skipped > 0 {
        eprintln!(
            "{skipped} tests need root (eBPF, loop devices) and are ignored: run `cargo xtask test` as root"
        );
    }
    let trials = all
        .into_iter()
        .map(|(name, f, needs_root)| {
            Trial::test(name, move || {
                f();
                Ok(())
            })
            .with_ignored_flag(needs_root && !root)
        })
        .collect();
    // Every `fsprof run` of the tests records into a history of their own, not the user's.
    let history = std::env::temp_dir().join(format!("fsprof-tests-history-{}", std::process::id()));
    // SAFETY: no other thread exists yet.
    unsafe { std::env::set_var(fsprof::history::HISTORY_ENV, history.join("history.sqlite")) };
    let conclusion = libtest_mimic::run(&Arguments::from_args(), trials);
    let _ = std::fs::remove_dir_all(&history);
    conclusion.exit();
}
