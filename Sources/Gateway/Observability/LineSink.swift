import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Log lines for standard output or standard error, written by one thread of their own: an
/// event loop only appends to a buffer, so a slow or stopped log reader (a full pipe, a stuck
/// journald) never stalls a request. The buffer is bounded (`capacity` bytes); beyond it lines
/// are dropped and counted (`sessiongate_log_lines_dropped_total`), never blocked on.
public final class LineSink: @unchecked Sendable {
    public static let standardOutput = LineSink(fd: 1)
    public static let standardError = LineSink(fd: 2)

    private let fd: Int32
    private let capacity: Int
    private let condition = NSCondition()
    // Guarded by `condition`.
    private var pending: [UInt8] = []
    private var writing = false
    private var writerWaiting = false
    private var dropped = 0

    init(fd: Int32, capacity: Int = 8 << 20) {
        self.fd = fd
        self.capacity = capacity
        // The sinks live as long as the process (two static instances): the thread keeps its sink.
        let thread = Thread { self.run() }
        thread.name = "sessiongate-log-\(fd)"
        thread.start()
    }

    /// Appends one line (with its newline); drops it when the buffer is full.
    public func write(_ line: String) {
        var line = line
        line.withUTF8 { bytes in
            condition.lock()
            defer { condition.unlock() }
            guard pending.count + bytes.count <= capacity else {
                dropped += 1
                return
            }
            pending.append(contentsOf: bytes)
            if writerWaiting { condition.broadcast() }
        }
    }

    /// Lines dropped so far because the reader did not keep up.
    public var droppedLines: Int {
        condition.lock()
        defer { condition.unlock() }
        return dropped
    }

    /// Suspends the calling thread until every line appended so far is written, or `timeout`
    /// has passed (a reader that stopped reading must not hold the process at exit).
    public func flush(timeout: TimeInterval = 2) {
        let deadline = Date(timeIntervalSinceNow: timeout)
        condition.lock()
        defer { condition.unlock() }
        while !pending.isEmpty || writing {
            if !condition.wait(until: deadline) { return }
        }
    }

    private func run() {
        var batch: [UInt8] = []
        while true {
            condition.lock()
            while pending.isEmpty {
                writerWaiting = true
                condition.wait()
            }
            writerWaiting = false
            swap(&batch, &pending)
            writing = true
            condition.unlock()

            var offset = 0
            while offset < batch.count {
                let n = batch.withUnsafeBytes { Self.systemWrite(fd, $0.baseAddress! + offset, $0.count - offset) }
                if n > 0 {
                    offset += n
                } else if n < 0, errno == EINTR {
                    continue
                } else if n < 0, errno == EAGAIN || errno == EWOULDBLOCK {
                    // A non-blocking descriptor inherited from the parent: wait until it drains.
                    var waitFor = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                    _ = poll(&waitFor, 1, 1000)
                } else {
                    break
                }
            }
            // What could not be written (a closed pipe, a bad descriptor) is counted as dropped.
            let lost = offset < batch.count ? batch[offset...].reduce(0) { $1 == UInt8(ascii: "\n") ? $0 + 1 : $0 } : 0
            batch.removeAll(keepingCapacity: true)

            condition.lock()
            dropped += lost
            writing = false
            condition.broadcast()
            condition.unlock()
        }
    }

    /// write(2), named by its module: inside this class a bare `write` is `write(_:)` above.
    private static func systemWrite(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
        #if canImport(Glibc)
        return Glibc.write(fd, bytes, count)
        #elseif canImport(Darwin)
        return Darwin.write(fd, bytes, count)
        #else
        #error("LineSink writes with write(2) from Glibc or Darwin")
        #endif
    }
}
