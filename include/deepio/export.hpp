// DEEPIO_API: what libdeepio.so exports.
//
// deepio is compiled with -fvisibility=hidden: every function and class of src/ stays inside
// the library, so a program linking deepio::deepio can use include/deepio and nothing else, and
// the internals may change without breaking it. Each public function and each public class with
// out-of-line members (or a vtable and typeinfo that exceptions and dynamic_cast need across
// the library boundary, as for deepio::Error) carries DEEPIO_API. Plain structs and enums with
// only inline code need nothing. The same attribute serves when building and when using the
// library (ELF has no import/export distinction), and does nothing for the static archive.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define DEEPIO_API __attribute__((visibility("default")))
#else
#define DEEPIO_API
#endif
