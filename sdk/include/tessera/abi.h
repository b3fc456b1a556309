/* tessera plugin ABI: versions, status codes, descriptors, declared parameters.
 *
 * Rules (see docs/abi.md):
 *  - C99 only; compiles with -std=c99 -pedantic -Werror and as C++20.
 *  - Every struct crossing the boundary starts with `size_t struct_size` and only
 *    ever grows at its end. A reader checks TSR_HAS_FIELD before touching a field
 *    added after 1.0.
 *  - Every call returns a tsr_status; the message travels through the host's
 *    error callback into host-owned storage.
 *  - A plugin library exports exactly one symbol: tessera_plugin_library. */
#ifndef TESSERA_ABI_H
#define TESSERA_ABI_H

#include <stddef.h>
#include <stdint.h>

#define TSR_ABI_MAJOR 1
#define TSR_ABI_MINOR 12

#if defined(_WIN32)
#define TSR_EXPORT __declspec(dllexport)
#else
#define TSR_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
#define TSR_EXTERN_C extern "C"
#else
#define TSR_EXTERN_C
#endif

/* Status codes. 0 is success; the rest say which kind of failure. */
typedef int32_t tsr_status;
#define TSR_OK 0
#define TSR_ERR_INVALID 1     /* bad argument or shape */
#define TSR_ERR_CONFIG 2      /* bad configuration value */
#define TSR_ERR_IO 3          /* file or network I/O */
#define TSR_ERR_NO_MEMORY 4   /* allocation failed or over the memory cap */
#define TSR_ERR_UNSUPPORTED 5 /* device, dtype or feature not supported */
#define TSR_ERR_COMM 6        /* a collective or the rendezvous failed */
#define TSR_ERR_INTERNAL 7    /* a bug, or an exception caught at the boundary */
#define TSR_ERR_ABORTED 8     /* another rank failed; stop promptly */

/* The struct_size rule. Writers set struct_size to the size of the fields
 * they know, tsr_<type>_STRUCT_SIZE (defined after each struct from its last
 * field, see TSR_STRUCT_SIZE below); readers only touch fields that lie
 * wholly inside struct_size, and a callee filling a caller's struct copies at
 * most struct_size bytes and leaves struct_size as the caller set it. The
 * one exception is an array's element (tsr_param_decl): its struct_size is
 * the array's stride, sizeof. */
#define TSR_HAS_FIELD(ptr, type, field) \
  ((ptr) != NULL && (ptr)->struct_size >= offsetof(type, field) + sizeof(((const type *)0)->field))

/* ABI 1.2: the size a writer declares for a struct, computed from its last
 * field (PJRT's PJRT_STRUCT_SIZE) rather than sizeof, so tail padding is
 * never claimed as a field: a later minor version may put a field there.
 * Each struct's header defines tsr_<type>_STRUCT_SIZE with it, and a minor
 * version that appends a field moves that definition to the new field. */
#define TSR_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((const type *)0)->last_field))

/* The host, opaque to plugins; every host callback takes it first. */
typedef struct tsr_host_ctx tsr_host_ctx;

/* Devices a plugin supports (bit mask). */
#define TSR_DEVICE_CPU 1u
#define TSR_DEVICE_CUDA 2u

/* Types of declared config parameters. */
typedef int32_t tsr_param_type;
#define TSR_PARAM_BOOL 1
#define TSR_PARAM_INT 2
#define TSR_PARAM_FLOAT 3
#define TSR_PARAM_STRING 4
#define TSR_PARAM_INT_ARRAY 5
#define TSR_PARAM_FLOAT_ARRAY 6
#define TSR_PARAM_STRING_ARRAY 7

/* One config parameter a plugin accepts. The host validates the user's table
 * against these before the plugin is created, fills in defaults, and refuses
 * unknown keys. */
typedef struct tsr_param_decl {
  size_t struct_size;
  const char *name;
  tsr_param_type type;
  /* Default in TOML syntax ("0.9", "true", "\"relu\"", "[256, 128]"); NULL means
   * the key is required. */
  const char *default_value;
  const char *doc;
  /* Numeric range, checked for INT/FLOAT and every element of their arrays. */
  int32_t has_min;
  double min;
  int32_t has_max;
  double max;
  /* For STRING: allowed values separated by '|', or NULL for any. An item
   * '#' also allows a number within min..max (has_min/has_max), written as a
   * number or as its text, which the plugin reads as a string ("0.5"): a
   * value that is a number or a word ("auto|#"). An item '*' beside '#'
   * allows any text as well, which the reader checks itself: a number or
   * a size with its unit ("#|*": 1073741824 or "1GiB"). */
  const char *choices;
} tsr_param_decl;

/* Kind identifiers with their revision. */
#define TSR_KIND_MODEL "tessera.model/1"
#define TSR_KIND_DATASET "tessera.dataset/1"
#define TSR_KIND_SAMPLER "tessera.sampler/1"
#define TSR_KIND_OPTIMIZER "tessera.optimizer/1"
#define TSR_KIND_ZERO "tessera.zero/1"
#define TSR_KIND_OFFLOAD "tessera.offload/1"

/* One plugin inside a library. `vtable` points at the kind's function table
 * (tsr_model_vtable, ...), whose first member is its own struct_size. */
typedef struct tsr_plugin_descriptor {
  size_t struct_size;
  const char *kind; /* one of TSR_KIND_* */
  const char *name;
  const char *version;
  const char *summary;
  const tsr_param_decl *params;
  size_t num_params;
  uint32_t devices; /* TSR_DEVICE_* bits */
  const void *vtable;
  /* ABI 1.2 (optional, may be NULL): the table of the extension `id`
   * (extensions.h: TSR_EXT_*) this plugin offers, or NULL when it offers
   * none by that id. */
  const void *(*get_extension)(const char *id);
} tsr_plugin_descriptor;
#define tsr_plugin_descriptor_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_plugin_descriptor, get_extension)

/* What the entry symbol returns: static storage, valid for the life of the
 * process. */
typedef struct tsr_plugin_library {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const tsr_plugin_descriptor *const *plugins;
  size_t num_plugins;
} tsr_plugin_library;
#define tsr_plugin_library_STRUCT_SIZE TSR_STRUCT_SIZE(tsr_plugin_library, num_plugins)

#define TSR_ENTRY_SYMBOL "tessera_plugin_library"
typedef const tsr_plugin_library *(*tsr_plugin_library_fn)(void);

/* Declares the entry point in a plugin source file:
 *   TSR_PLUGIN_ENTRY { return &my_library; } */
#define TSR_PLUGIN_ENTRY \
  TSR_EXTERN_C TSR_EXPORT const tsr_plugin_library *tessera_plugin_library(void)

#endif /* TESSERA_ABI_H */
