// Empty: lets fsprof take this crate as a build-dependency so cargo rebuilds on changes.
#![no_std]
