import Foundation

#if canImport(Glibc)
import Glibc
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
        let thread = Thread { [unowned self] in self.run() }
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

    /// Suspends the calling thread until every line appended so far is written (exit paths).
    public func flush() {
        condition.lock()
        defer { condition.unlock() }
        while !pending.isEmpty || writing { condition.wait() }
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
                let n = batch.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) }
                if n > 0 { offset += n } else if n < 0, errno == EINTR { continue } else { break }
            }
            batch.removeAll(keepingCapacity: true)

            condition.lock()
            writing = false
            condition.broadcast()
            condition.unlock()
        }
    }
}
