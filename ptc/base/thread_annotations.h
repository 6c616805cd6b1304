// Clang thread-safety annotations, as in leveldb's port/thread_annotations.h
// (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html). With clang and
// -Wthread-safety (the `tsa` build, PTCFS_THREAD_SAFETY=ON) the compiler
// checks that every member marked GUARDED_BY is touched only with its lock
// held and that REQUIRES / EXCLUDES hold at each call; on other compilers the
// macros expand to nothing.
//
// Use them with ptc::Mutex and its guards (ptc/base/mutex.h): std::mutex
// carries no annotations, so the analysis cannot see it taken.
#pragma once

#if defined(__clang__)
#define PTC_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define PTC_THREAD_ANNOTATION_(x)  // no-op
#endif

// A type that is a lock (ptc::Mutex).
#ifndef CAPABILITY
#define CAPABILITY(x) PTC_THREAD_ANNOTATION_(capability(x))
#endif
// An RAII type that holds a lock for its lifetime (ptc::MutexLock).
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY PTC_THREAD_ANNOTATION_(scoped_lockable)
#endif

// A member read and written only with lock x held.
#ifndef GUARDED_BY
#define GUARDED_BY(x) PTC_THREAD_ANNOTATION_(guarded_by(x))
#endif
// A pointer member whose pointee is read and written only with lock x held.
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) PTC_THREAD_ANNOTATION_(pt_guarded_by(x))
#endif

// The caller must hold the locks (exclusively / at least shared).
#ifndef REQUIRES
#define REQUIRES(...) PTC_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#endif
#ifndef REQUIRES_SHARED
#define REQUIRES_SHARED(...) PTC_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#endif
// The caller must not hold the locks (the function takes them).
#ifndef EXCLUDES
#define EXCLUDES(...) PTC_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#endif

// The function takes / releases the locks (no argument: `this`).
#ifndef ACQUIRE
#define ACQUIRE(...) PTC_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) PTC_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#endif
#ifndef ACQUIRE_SHARED
#define ACQUIRE_SHARED(...) PTC_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#endif
#ifndef RELEASE_SHARED
#define RELEASE_SHARED(...) PTC_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#endif
// The function takes the locks when it returns the first argument.
#ifndef TRY_ACQUIRE
#define TRY_ACQUIRE(...) PTC_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#endif
// The function checks at run time that the lock is held (and tells the analysis so).
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) PTC_THREAD_ANNOTATION_(assert_capability(x))
#endif

// Turns the analysis off for one function. Say next to each use why the
// analysis cannot follow it.
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS PTC_THREAD_ANNOTATION_(no_thread_safety_analysis)
#endif
