import CHiredis
import NIOCore

/// A Redis reply (RESP2).
public enum RESPValue: Sendable, Equatable {
    case simpleString(String)
    case error(String)
    case integer(Int64)
    /// A bulk string; `nil` is Redis's null bulk reply.
    case bulkString([UInt8]?)
    /// An array; `nil` is the null array.
    case array([RESPValue]?)

    /// The value as text, for bulk and simple strings.
    public var string: String? {
        switch self {
        case .simpleString(let s): return s
        case .bulkString(let bytes?): return String(decoding: bytes, as: UTF8.self)
        default: return nil
        }
    }

    public var bytes: [UInt8]? {
        switch self {
        case .bulkString(let bytes): return bytes
        case .simpleString(let s): return Array(s.utf8)
        default: return nil
        }
    }

    public var int: Int64? {
        if case .integer(let n) = self { return n }
        return nil
    }

    public var isNull: Bool {
        switch self {
        case .bulkString(nil), .array(nil): return true
        default: return false
        }
    }

    /// Copies a hiredis reply tree (the caller frees it).
    init(reply: UnsafePointer<redisReply>) {
        let r = reply.pointee
        switch r.type {
        case REDIS_REPLY_STATUS: self = .simpleString(String(decoding: UnsafeRawBufferPointer(start: r.str, count: Int(r.len)), as: UTF8.self))
        case REDIS_REPLY_ERROR: self = .error(String(decoding: UnsafeRawBufferPointer(start: r.str, count: Int(r.len)), as: UTF8.self))
        case REDIS_REPLY_INTEGER: self = .integer(Int64(r.integer))
        case REDIS_REPLY_STRING: self = .bulkString(Array(UnsafeRawBufferPointer(start: r.str, count: Int(r.len))))
        case REDIS_REPLY_ARRAY:
            var elements: [RESPValue] = []
            elements.reserveCapacity(Int(r.elements))
            for i in 0..<Int(r.elements) {
                if let element = r.element[i] { elements.append(RESPValue(reply: element)) }
            }
            self = .array(elements)
        default:  // REDIS_REPLY_NIL
            self = .bulkString(nil)
        }
    }
}

/// A command argument: text or raw bytes (binary safe).
public enum RedisArgument: Sendable, ExpressibleByStringLiteral {
    case string(String)
    case bytes([UInt8])

    public init(stringLiteral value: String) { self = .string(value) }
    public init(_ value: String) { self = .string(value) }
    public init(_ value: Int64) { self = .string(String(value)) }

    var utf8: [UInt8] {
        switch self {
        case .string(let s): return Array(s.utf8)
        case .bytes(let b): return b
        }
    }
}

/// RESP framing: commands are written straight into the outgoing buffer (an array of bulk
/// strings: no copy of an argument but the one into the buffer), and a `redisReader` decodes
/// replies. The bytes move through SwiftNIO; hiredis never touches a socket.
enum RESPCodec {
    /// Appends one command (binary safe) to `buffer`.
    static func encode(_ arguments: [RedisArgument], into buffer: inout ByteBuffer) {
        buffer.writeInteger(UInt8(ascii: "*"))
        buffer.writeString(String(arguments.count))
        buffer.writeStaticString("\r\n")
        for argument in arguments {
            buffer.writeInteger(UInt8(ascii: "$"))
            switch argument {
            case .string(let s):
                buffer.writeString(String(s.utf8.count))
                buffer.writeStaticString("\r\n")
                buffer.writeString(s)
            case .bytes(let b):
                buffer.writeString(String(b.count))
                buffer.writeStaticString("\r\n")
                buffer.writeBytes(b)
            }
            buffer.writeStaticString("\r\n")
        }
    }

    /// An incremental decoder around one `redisReader`.
    final class Decoder {
        private let reader: UnsafeMutablePointer<redisReader>

        init() { reader = redisReaderCreate() }
        deinit { redisReaderFree(reader) }

        enum Failure: Error { case protocolError(String) }

        /// Feeds bytes; returns every complete reply now available.
        func feed(_ buffer: ByteBuffer) throws -> [RESPValue] {
            buffer.withUnsafeReadableBytes { raw in
                _ = redisReaderFeed(reader, raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count)
            }
            var replies: [RESPValue] = []
            while true {
                var reply: UnsafeMutableRawPointer? = nil
                if redisReaderGetReply(reader, &reply) != REDIS_OK || sg_redis_reader_failed(reader) != 0 {
                    throw Failure.protocolError(String(cString: sg_redis_reader_error(reader)))
                }
                guard let reply else { return replies }
                replies.append(RESPValue(reply: reply.assumingMemoryBound(to: redisReply.self)))
                freeReplyObject(reply)
            }
        }
    }
}
