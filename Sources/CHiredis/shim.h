#ifndef SESSIONGATE_CHIREDIS_SHIM_H
#define SESSIONGATE_CHIREDIS_SHIM_H
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

/* Function-like macros are not imported into Swift: tiny inline wrappers. */
static inline const char *sg_redis_reader_error(redisReader *reader) { return reader->errstr; }
static inline int sg_redis_reader_failed(redisReader *reader) { return reader->err != 0; }
#endif
