// An m0-embed forward pass on Core ML (the Neural Engine, GPU or CPU, as Core ML
// picks), written against include/m0embed_backend.h alone. A sketch: it has
// never been compiled on the Linux machines this project is tested on (see
// README.md here for the macOS build command and what the model must look like).
//
// MODEL_DIR holds the sentence-transformers folder the plugin reads (its
// tokenizer, its dimension) and `model.mlpackage`: an encoder converted with
// coremltools whose inputs are `input_ids` and `attention_mask` (Int32,
// [rows, tokens], flexible shapes up to the limits) and whose one output is the
// mean-pooled `sentence_embedding` (Float32, [rows, dim]).

import CoreML
import Foundation
import M0EmbedBackend

/// What `load` made: the compiled model and what `describe` answers.
private final class Backend {
    let model: MLModel
    let dim: Int
    let name: UnsafeMutablePointer<CChar>
    /// Heap memory of its own: `describe` hands out a pointer valid until unload.
    let info: UnsafeMutablePointer<M0EmbedInfo>

    init(model: MLModel, dim: Int) {
        self.model = model
        self.dim = dim
        name = strdup("coreml_backend.swift 0.1")
        info = UnsafeMutablePointer<M0EmbedInfo>.allocate(capacity: 1)
        info.initialize(to: M0EmbedInfo(
            size: UInt32(MemoryLayout<M0EmbedInfo>.size), dim: UInt32(dim),
            inputs: UInt32(M0_EMBED_INPUT_PADDED), holds_lock: 0, threads: 1,
            name: UnsafePointer(name)))
    }

    deinit {
        info.deallocate()
        free(name)
    }
}

/// Writes `message` into the caller's error buffer (no more than its `size`
/// allows) and returns M0_EMBED_ERR_FAILED.
private func fail(_ error: UnsafeMutablePointer<M0EmbedError>?, _ message: String) -> Int32 {
    guard let error else { return Int32(M0_EMBED_ERR_FAILED) }
    let room = min(Int(M0_EMBED_ERROR_MESSAGE_LEN), max(0, Int(error.pointee.size) - 8))
    let bytes = Array(message.utf8.prefix(room))
    withUnsafeMutableBytes(of: &error.pointee.message) { $0.copyBytes(from: bytes) }
    error.pointee.message_len = UInt32(bytes.count)
    return Int32(M0_EMBED_ERR_FAILED)
}

/// An Int32 [rows, width] array of `values`.
private func int32Array(_ values: UnsafePointer<Int32>, rows: Int, width: Int) throws -> MLMultiArray {
    let array = try MLMultiArray(shape: [NSNumber(value: rows), NSNumber(value: width)], dataType: .int32)
    let dst = array.dataPointer.bindMemory(to: Int32.self, capacity: rows * width)
    dst.update(from: values, count: rows * width)
    return array
}

private let load: @convention(c) (
    UnsafePointer<CChar>?, UnsafePointer<M0EmbedLimits>?,
    UnsafeMutablePointer<UnsafeMutableRawPointer?>?, UnsafeMutablePointer<M0EmbedError>?
) -> Int32 = { dir, limits, state, err in
    guard let dir, let state else { return fail(err, "coreml: load called without a folder") }
    let folder = URL(fileURLWithPath: String(cString: dir))
    let package = folder.appendingPathComponent("model.mlpackage")
    do {
        // Compiling takes seconds and is done once per worker; a deployment
        // would ship the compiled .mlmodelc instead.
        let compiled = try MLModel.compileModel(at: package)
        let config = MLModelConfiguration()
        config.computeUnits = .all
        let model = try MLModel(contentsOf: compiled, configuration: config)
        guard let output = model.modelDescription.outputDescriptionsByName["sentence_embedding"],
              let shape = output.multiArrayConstraint?.shape, let dim = shape.last?.intValue, dim > 0
        else {
            return fail(err, "coreml: \(package.path) has no Float32 [rows, dim] output sentence_embedding")
        }
        _ = limits // a model with flexible shapes takes any batch up to them
        state.pointee = Unmanaged.passRetained(Backend(model: model, dim: dim)).toOpaque()
        return Int32(M0_EMBED_OK)
    } catch {
        return fail(err, "coreml: cannot load \(package.path): \(error)")
    }
}

private let describe: @convention(c) (UnsafeMutableRawPointer?) -> UnsafePointer<M0EmbedInfo>? = { state in
    guard let state else { return nil }
    return UnsafePointer(Unmanaged<Backend>.fromOpaque(state).takeUnretainedValue().info)
}

private let forward: @convention(c) (
    UnsafeMutableRawPointer?, UnsafePointer<M0EmbedBatch>?, UnsafeMutablePointer<Float>?,
    UnsafeMutablePointer<M0EmbedError>?
) -> Int32 = { state, batch, out, err in
    guard let state, let batch = batch?.pointee, let out, let ids = batch.ids, let mask = batch.mask else {
        return fail(err, "coreml: forward wants padded inputs and an output buffer")
    }
    let backend = Unmanaged<Backend>.fromOpaque(state).takeUnretainedValue()
    let rows = Int(batch.rows), width = Int(batch.width)
    do {
        let inputs = try MLDictionaryFeatureProvider(dictionary: [
            "input_ids": try int32Array(ids, rows: rows, width: width),
            "attention_mask": try int32Array(mask, rows: rows, width: width),
        ])
        let result = try backend.model.prediction(from: inputs)
        guard let vectors = result.featureValue(for: "sentence_embedding")?.multiArrayValue,
              vectors.dataType == .float32, vectors.count == rows * backend.dim
        else {
            return fail(err, "coreml: the model did not give Float32 [\(rows), \(backend.dim)]")
        }
        out.update(from: vectors.dataPointer.bindMemory(to: Float.self, capacity: vectors.count),
                   count: rows * backend.dim)
        return Int32(M0_EMBED_OK)
    } catch {
        return fail(err, "coreml: prediction failed: \(error)")
    }
}

private let unload: @convention(c) (UnsafeMutableRawPointer?) -> Void = { state in
    if let state { Unmanaged<Backend>.fromOpaque(state).release() }
}

/// The table, made once (Swift initialises globals lazily and thread-safely).
private let table: UnsafeMutablePointer<M0EmbedBackend> = {
    let p = UnsafeMutablePointer<M0EmbedBackend>.allocate(capacity: 1)
    p.initialize(to: M0EmbedBackend(
        size: UInt32(MemoryLayout<M0EmbedBackend>.size),
        abi_major: UInt32(M0_EMBED_ABI_MAJOR), abi_minor: UInt32(M0_EMBED_ABI_MINOR),
        load: load, describe: describe, forward: forward, unload: unload))
    return p
}()

/// The one symbol the plugin looks up.
@_cdecl("m0_embed_backend")
public func m0EmbedBackend() -> UnsafePointer<M0EmbedBackend> {
    UnsafePointer(table)
}
