//! The ClickHouse error codes the component classifies (src/Common/ErrorCodes.cpp), by name,
//! one per line, as clickhouse-rs's `error_codes.rs` lists them.

/// ClickHouse's `UNEXPECTED_END_OF_FILE`.
pub const UNEXPECTED_END_OF_FILE: i32 = 3;
/// ClickHouse's `CANNOT_PARSE_TEXT`.
pub const CANNOT_PARSE_TEXT: i32 = 6;
/// ClickHouse's `THERE_IS_NO_COLUMN`.
pub const THERE_IS_NO_COLUMN: i32 = 8;
/// ClickHouse's `NO_SUCH_COLUMN_IN_TABLE`.
pub const NO_SUCH_COLUMN_IN_TABLE: i32 = 16;
/// ClickHouse's `CANNOT_PARSE_ESCAPE_SEQUENCE`.
pub const CANNOT_PARSE_ESCAPE_SEQUENCE: i32 = 25;
/// ClickHouse's `CANNOT_PARSE_QUOTED_STRING`.
pub const CANNOT_PARSE_QUOTED_STRING: i32 = 26;
/// ClickHouse's `CANNOT_PARSE_INPUT_ASSERTION_FAILED`.
pub const CANNOT_PARSE_INPUT_ASSERTION_FAILED: i32 = 27;
/// ClickHouse's `ATTEMPT_TO_READ_AFTER_EOF`.
pub const ATTEMPT_TO_READ_AFTER_EOF: i32 = 32;
/// ClickHouse's `CANNOT_READ_ALL_DATA`.
pub const CANNOT_READ_ALL_DATA: i32 = 33;
/// ClickHouse's `BAD_ARGUMENTS`.
pub const BAD_ARGUMENTS: i32 = 36;
/// ClickHouse's `CANNOT_PARSE_DATE`.
pub const CANNOT_PARSE_DATE: i32 = 38;
/// ClickHouse's `CANNOT_PARSE_DATETIME`.
pub const CANNOT_PARSE_DATETIME: i32 = 41;
/// ClickHouse's `ILLEGAL_TYPE_OF_ARGUMENT`.
pub const ILLEGAL_TYPE_OF_ARGUMENT: i32 = 43;
/// ClickHouse's `ILLEGAL_COLUMN`.
pub const ILLEGAL_COLUMN: i32 = 44;
/// ClickHouse's `UNKNOWN_FUNCTION`.
pub const UNKNOWN_FUNCTION: i32 = 46;
/// ClickHouse's `UNKNOWN_IDENTIFIER`.
pub const UNKNOWN_IDENTIFIER: i32 = 47;
/// ClickHouse's `TYPE_MISMATCH`.
pub const TYPE_MISMATCH: i32 = 53;
/// ClickHouse's `UNKNOWN_STORAGE`.
pub const UNKNOWN_STORAGE: i32 = 56;
/// ClickHouse's `UNKNOWN_TABLE`.
pub const UNKNOWN_TABLE: i32 = 60;
/// ClickHouse's `SYNTAX_ERROR`.
pub const SYNTAX_ERROR: i32 = 62;
/// ClickHouse's `ARGUMENT_OUT_OF_BOUND`.
pub const ARGUMENT_OUT_OF_BOUND: i32 = 69;
/// ClickHouse's `CANNOT_CONVERT_TYPE`.
pub const CANNOT_CONVERT_TYPE: i32 = 70;
/// ClickHouse's `CANNOT_PARSE_NUMBER`.
pub const CANNOT_PARSE_NUMBER: i32 = 72;
/// ClickHouse's `UNKNOWN_FORMAT`.
pub const UNKNOWN_FORMAT: i32 = 73;
/// ClickHouse's `UNKNOWN_DATABASE`.
pub const UNKNOWN_DATABASE: i32 = 81;
/// ClickHouse's `UNKNOWN_SETTING`.
pub const UNKNOWN_SETTING: i32 = 115;
/// ClickHouse's `INCORRECT_DATA`.
pub const INCORRECT_DATA: i32 = 117;
/// ClickHouse's `CANNOT_READ_ARRAY_FROM_TEXT`.
pub const CANNOT_READ_ARRAY_FROM_TEXT: i32 = 130;
/// ClickHouse's `TOO_LARGE_STRING_SIZE`.
pub const TOO_LARGE_STRING_SIZE: i32 = 131;
/// ClickHouse's `TIMEOUT_EXCEEDED`.
pub const TIMEOUT_EXCEEDED: i32 = 159;
/// ClickHouse's `READONLY`.
pub const READONLY: i32 = 164;
/// ClickHouse's `CANNOT_ALLOCATE_MEMORY`.
pub const CANNOT_ALLOCATE_MEMORY: i32 = 173;
/// ClickHouse's `SIZES_OF_ARRAYS_DONT_MATCH`.
pub const SIZES_OF_ARRAYS_DONT_MATCH: i32 = 190;
/// ClickHouse's `UNKNOWN_USER`.
pub const UNKNOWN_USER: i32 = 192;
/// ClickHouse's `WRONG_PASSWORD`.
pub const WRONG_PASSWORD: i32 = 193;
/// ClickHouse's `REQUIRED_PASSWORD`.
pub const REQUIRED_PASSWORD: i32 = 194;
/// ClickHouse's `IP_ADDRESS_NOT_ALLOWED`.
pub const IP_ADDRESS_NOT_ALLOWED: i32 = 195;
/// ClickHouse's `QUOTA_EXCEEDED`.
pub const QUOTA_EXCEEDED: i32 = 201;
/// ClickHouse's `TOO_MANY_SIMULTANEOUS_QUERIES`.
pub const TOO_MANY_SIMULTANEOUS_QUERIES: i32 = 202;
/// ClickHouse's `NO_FREE_CONNECTION`.
pub const NO_FREE_CONNECTION: i32 = 203;
/// ClickHouse's `SOCKET_TIMEOUT`.
pub const SOCKET_TIMEOUT: i32 = 209;
/// ClickHouse's `NETWORK_ERROR`.
pub const NETWORK_ERROR: i32 = 210;
/// ClickHouse's `NO_ZOOKEEPER`.
pub const NO_ZOOKEEPER: i32 = 225;
/// ClickHouse's `MEMORY_LIMIT_EXCEEDED`.
pub const MEMORY_LIMIT_EXCEEDED: i32 = 241;
/// ClickHouse's `TABLE_IS_READ_ONLY`.
pub const TABLE_IS_READ_ONLY: i32 = 242;
/// ClickHouse's `TOO_MANY_PARTS`.
pub const TOO_MANY_PARTS: i32 = 252;
/// ClickHouse's `ALL_CONNECTION_TRIES_FAILED`.
pub const ALL_CONNECTION_TRIES_FAILED: i32 = 279;
/// ClickHouse's `TOO_FEW_LIVE_REPLICAS`.
pub const TOO_FEW_LIVE_REPLICAS: i32 = 285;
/// ClickHouse's `UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE`: a sequential quorum insert refused
/// while the previous one has not reached its quorum.
pub const UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE: i32 = 286;
/// ClickHouse's `REPLICA_IS_NOT_IN_QUORUM`: a read with sequential consistency refused by a
/// replica that lacks the last quorum write.
pub const REPLICA_IS_NOT_IN_QUORUM: i32 = 289;
/// ClickHouse's `DATABASE_ACCESS_DENIED`.
pub const DATABASE_ACCESS_DENIED: i32 = 291;
/// ClickHouse's `UNKNOWN_STATUS_OF_INSERT`.
pub const UNKNOWN_STATUS_OF_INSERT: i32 = 319;
/// ClickHouse's `VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE`.
pub const VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE: i32 = 321;
/// ClickHouse's `UNFINISHED`: a mutation (a DELETE) not finished on every replica in time.
pub const UNFINISHED: i32 = 341;
/// ClickHouse's `CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN`.
pub const CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN: i32 = 349;
/// ClickHouse's `QUERY_IS_PROHIBITED` (e.g. `ON CLUSTER` where distributed DDL is off).
pub const QUERY_IS_PROHIBITED: i32 = 392;
/// ClickHouse's `ZLIB_INFLATE_FAILED`.
pub const ZLIB_INFLATE_FAILED: i32 = 354;
/// ClickHouse's `CANNOT_PARSE_UUID`.
pub const CANNOT_PARSE_UUID: i32 = 376;
/// ClickHouse's `QUERY_WAS_CANCELLED`.
pub const QUERY_WAS_CANCELLED: i32 = 394;
/// ClickHouse's `SYSTEM_ERROR`.
pub const SYSTEM_ERROR: i32 = 425;
/// ClickHouse's `CANNOT_SCHEDULE_TASK`.
pub const CANNOT_SCHEDULE_TASK: i32 = 439;
/// ClickHouse's `CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING`.
pub const CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING: i32 = 441;
/// ClickHouse's `SETTING_CONSTRAINT_VIOLATION`.
pub const SETTING_CONSTRAINT_VIOLATION: i32 = 452;
/// ClickHouse's `UNKNOWN_QUERY_PARAMETER`.
pub const UNKNOWN_QUERY_PARAMETER: i32 = 456;
/// ClickHouse's `BAD_QUERY_PARAMETER`.
pub const BAD_QUERY_PARAMETER: i32 = 457;
/// ClickHouse's `CANNOT_PARSE_BOOL`.
pub const CANNOT_PARSE_BOOL: i32 = 467;
/// ClickHouse's `VIOLATED_CONSTRAINT`.
pub const VIOLATED_CONSTRAINT: i32 = 469;
/// ClickHouse's `DEADLOCK_AVOIDED`.
pub const DEADLOCK_AVOIDED: i32 = 473;
/// ClickHouse's `ACCESS_DENIED`.
pub const ACCESS_DENIED: i32 = 497;
/// ClickHouse's `AUTHENTICATION_FAILED`.
pub const AUTHENTICATION_FAILED: i32 = 516;
/// ClickHouse's `ZSTD_DECODER_FAILED`.
pub const ZSTD_DECODER_FAILED: i32 = 561;
/// ClickHouse's `CANNOT_PARSE_IPV4`.
pub const CANNOT_PARSE_IPV4: i32 = 675;
/// ClickHouse's `CANNOT_PARSE_IPV6`.
pub const CANNOT_PARSE_IPV6: i32 = 676;
/// ClickHouse's `DECIMAL_OVERFLOW`.
pub const DECIMAL_OVERFLOW: i32 = 407;
/// ClickHouse's `UNEXPECTED_DATA_AFTER_PARSED_VALUE`.
pub const UNEXPECTED_DATA_AFTER_PARSED_VALUE: i32 = 632;
/// ClickHouse's `UNKNOWN_ELEMENT_OF_ENUM` (an Enum value that is not one of its elements).
pub const UNKNOWN_ELEMENT_OF_ENUM: i32 = 691;
/// ClickHouse's `KEEPER_EXCEPTION`.
pub const KEEPER_EXCEPTION: i32 = 999;
/// ClickHouse's `POCO_EXCEPTION`.
pub const POCO_EXCEPTION: i32 = 1000;
