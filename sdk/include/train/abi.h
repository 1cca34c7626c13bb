/* The C boundary between a trainrun worker and a plugin.
 *
 * A plugin exports one symbol, `train_plugin_v1`, a descriptor the worker reads
 * after dlopen. The worker calls an entry with a host table of plain data and C
 * callbacks. Nothing else is shared: no C++ object crosses this boundary except
 * the c10d process group, and only after the LibTorch version and C++ ABI of
 * both sides were checked to match. Both structs start with a version and a size
 * so they can grow; readers check both before touching later fields. */
#ifndef TRAIN_ABI_H_
#define TRAIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_PLUGIN_ABI_VERSION 1
#define TRAIN_PLUGIN_SYMBOL "train_plugin_v1"

#define TRAIN_PLUGIN_INFO_SECTION ".trainrun_info"
#define TRAIN_PLUGIN_ENTRIES_SECTION ".trainrun_entries"
#define TRAIN_PLUGIN_INFO_MAGIC "TRAINRUN"

/* Return codes of an entry. */
#define TRAIN_OK 0
#define TRAIN_ERROR_EXCEPTION 1 /* train_func threw; the message is in `error` */
#define TRAIN_ERROR_HOST 2      /* the host table is too old or malformed */

/* Handed by the worker to an entry; valid until the entry returns. */
typedef struct train_host_v1_s {
  uint32_t abi_version;
  uint32_t struct_size;
  void* handle; /* passed back to every callback */

  int32_t world_rank;
  int32_t local_rank;
  int32_t node_rank;
  int32_t world_size;
  int32_t local_world_size;
  const char* device; /* "cpu" or "cuda:N" */
  const char* run_name;
  const char* storage_path; /* <storage_path>/<run_name> is the run directory */

  const uint8_t* config; /* msgpack map of the run's config */
  size_t config_size;

  void* process_group; /* c10d::ProcessGroup*, owned by the worker */

  /* Reports rank-local metrics (a msgpack map) and, unless NULL, a directory of
   * checkpoint files; blocks until every rank has reported the same iteration
   * and the checkpoint is committed. Returns 0, or non-zero with a message. */
  int (*report)(void* handle, const uint8_t* metrics, size_t metrics_size,
                const char* checkpoint_dir, char* error, size_t error_size);

  /* Writes the directory of the latest committed checkpoint into `path` ("" when
   * there is none), after checking its files. Returns 0, or non-zero with a
   * message. */
  int (*get_checkpoint)(void* handle, char* path, size_t path_size, char* error, size_t error_size);

  /* Fields below were added to ABI 1 later: a plugin reads one only when
   * struct_size covers it (TRAIN_HOST_HAS).
   *
   * Where the train function is in its data: the loader's epoch, the batches
   * done in it of `batches`, and since the entry began, the batches and samples
   * done on this rank. Never blocks and never fails; the host drops what it
   * does not need (ranks other than 0, calls faster than it sends). */
  void (*progress)(void* handle, int64_t epoch, int64_t batch, int64_t batches, int64_t steps,
                   int64_t samples);

  /* report, with a checkpoint directory (not NULL) and how to upload it:
   * TRAIN_UPLOAD_SYNC is report; TRAIN_UPLOAD_ASYNC hands the directory over to
   * the host, which moves it away at once, returns once every rank reported
   * and handed its directory over, and uploads, commits and deletes it in the
   * background. Returns 0, or non-zero with a message (a directory that cannot
   * be handed over stays where it was). */
  int (*report_checkpoint)(void* handle, const uint8_t* metrics, size_t metrics_size,
                           const char* checkpoint_dir, uint32_t upload_mode, char* error,
                           size_t error_size);

  /* Waits until every rank has reached its next report, records nothing: the
   * SDK calls it before a report's own collectives (the replica check), so
   * that a rank that returned from train_func, or reports fewer times, ends the
   * run naming itself instead of leaving the others inside a collective.
   * Returns 0, or non-zero with a message. */
  int (*arrive)(void* handle, char* error, size_t error_size);

  /* LibTorch's profiler over steps profile_first to profile_last (from 1; a
   * step is one backward pass through a prepared model), written as a Chrome
   * trace to profile_path; profile_first 0: no profile. */
  int64_t profile_first;
  int64_t profile_last;
  const char* profile_path;

  /* In-place recovery (docs/design.md, "Recovery in place"). in_place is 1
   * when the run lets the survivors of a lost rank go on in a new group, 0
   * when a lost rank restarts the whole group.
   *
   * group_generation: the newest generation of the group the controller has
   * announced (0 is the group of process_group); it grows by one each time
   * ranks are lost. Never blocks; callable from any thread. */
  int32_t in_place;
  int64_t (*group_generation)(void* handle);

  /* Joins the group of the newest generation after `after`, waiting (bounded
   * by the collective timeout) for the controller to announce one: returns
   * its c10d::ProcessGroup* (owned by the worker) and writes its generation,
   * this rank's rank in it and its size; NULL with a message when it cannot. */
  void* (*regroup)(void* handle, int64_t after, int64_t* generation, int32_t* rank, int32_t* size,
                   char* error, size_t error_size);

  /* Whether synchronised step `step` (counted from 1 on each rank) is applied:
   * this rank's collectives of it completed in group `generation`. Waits for
   * every rank of that group to vote, or for the generation to end. Returns
   * 1 (apply it), 2 (apply it, and a replacement joins the group at the
   * next step boundary: regroup forms the group with it), 0 (a rank was
   * lost: the step is done again in the next group), or -1 with a message.
   * 2 comes only to a rank whose train function called joinable(1). */
  int (*step_vote)(void* handle, int64_t step, int64_t generation, char* error, size_t error_size);

  /* The train function took the process group itself (train::process_group):
   * its own collectives cannot be done again in a new group, so a lost rank
   * restarts the group instead. Called once per entry; never blocks. */
  void (*group_taken)(void* handle);

  /* A replacement that catches up from a peer (docs/design.md, "A
   * replacement catches up"). joining is 1 on a rank started in place of a
   * lost one: process_group is NULL, and regroup(handle, 0, ...) joins the
   * survivors' group once they reach their next step boundary; the state it
   * needs comes over that group from the group's first rank.
   *
   * joinable, with `state`: 1, the train function takes a replacement at its
   * step boundaries and sends it its state there (train::Trainer's loop
   * does; on a joining rank: it waits to join); 0, it no longer does (the
   * loop ended); 2, it is at such a boundary, and its next regroup forms the
   * group with the replacement that a step_vote of 2 announced. Never
   * blocks. */
  int32_t joining;
  void (*joinable)(void* handle, int32_t state);

  /* Data in object storage (docs/data.md), read with the run's S3 settings
   * (the endpoint, region and credentials an s3:// storage path uses).
   * object_size writes the size of the object at `url` (s3://BUCKET/KEY);
   * read_object reads `length` bytes of it from `offset` into `out`. A
   * transient error (a 5xx, a reset, a stall) is retried with back-off, and
   * every wait is bounded. Each returns 0; 2 when there is no such object (or
   * it ends before the range); 1 with a message otherwise. Callable from any
   * thread, several at once. */
  int (*object_size)(void* handle, const char* url, uint64_t* size, char* error,
                     size_t error_size);
  int (*read_object)(void* handle, const char* url, uint64_t offset, uint64_t length, void* out,
                     char* error, size_t error_size);
} train_host_v1_t;

/* report_checkpoint's upload_mode. */
#define TRAIN_UPLOAD_SYNC 0u
#define TRAIN_UPLOAD_ASYNC 1u

/* The size of the first host table of ABI 1: a plugin accepts a table at least
 * this big, and uses later fields only when struct_size covers them. */
#define TRAIN_HOST_V1_MIN_SIZE offsetof(train_host_v1_t, progress)
#define TRAIN_HOST_HAS(host, field) \
  ((host)->struct_size >= offsetof(train_host_v1_t, field) + sizeof((host)->field))

typedef int (*train_entry_fn_v1_t)(const train_host_v1_t* host, char* error, size_t error_size);

typedef struct train_entry_v1_s {
  const char* name;
  train_entry_fn_v1_t fn;
} train_entry_v1_t;

/* The pointer-free record in the `.trainrun_info` section. */
typedef struct train_plugin_info_v1_s {
  char magic[8]; /* "TRAINRUN", not NUL-terminated */
  uint32_t abi_version;
  uint32_t struct_size;
  int32_t cxx11_abi;
  char sdk_version[16];
  char torch_version[32];
} train_plugin_info_v1_t;

/* The exported descriptor. Entries are registered by TRAIN_FUNC at load time. */
typedef struct train_plugin_v1_s {
  uint32_t abi_version;
  uint32_t struct_size;
  const char* sdk_version;
  const char* torch_version;
  int32_t cxx11_abi; /* _GLIBCXX_USE_CXX11_ABI the plugin was built with */
  uint32_t num_entries;
  const train_entry_v1_t* entries;
} train_plugin_v1_t;

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_ABI_H_ */
