//! Bring-up and properties on whatever Vulkan device the machine has (lavapipe in CI without a GPU).

use std::sync::Arc;

use heapscope_vulkan::ash::vk;

#[test]
fn bring_up_and_properties() {
    let Some(context) = crate::common::context() else { return };
    let properties = context.properties();
    assert!(!properties.name.is_empty());
    assert!(properties.api_version >= vk::API_VERSION_1_1, "{}", properties.api_version_text());
    assert!(!properties.memory_types.is_empty() && !properties.memory_heaps.is_empty());
    for memory_type in &properties.memory_types {
        assert!((memory_type.heap_index as usize) < properties.memory_heaps.len(), "{memory_type:?}");
        assert_eq!(properties.heap_of_type(memory_type.index), properties.memory_heaps.get(memory_type.heap_index as usize));
    }
    let limits = properties.limits;
    assert!(limits.max_memory_allocation_count >= 4096, "the spec's minimum: {limits:?}");
    assert!(limits.buffer_image_granularity_bytes.is_power_of_two() && limits.non_coherent_atom_size_bytes.is_power_of_two());

    let (compute_family, _) = context.compute_queue();
    let compute_flags = properties.queue_families[compute_family as usize].flags;
    assert!(compute_flags.contains(vk::QueueFlags::COMPUTE));
    let enabled = context.enabled_features();
    let supported = properties.supported_features;
    assert_eq!(enabled, supported, "every feature heapscope uses is enabled where the device has it");
    match context.sparse_queue_family() {
        Some(family) => assert!(properties.queue_families[family as usize].flags.contains(vk::QueueFlags::SPARSE_BINDING)),
        None => assert!(!enabled.sparse_binding),
    }

    let budgets = context.heap_budgets();
    assert_eq!(budgets.len(), properties.memory_heaps.len());
    for budget in &budgets {
        assert!(budget.budget_bytes > 0, "{budget:?}");
        assert_eq!(budget.from_extension, enabled.memory_budget);
    }
    eprintln!(
        "{} (vendor {:#x}, {:?}, Vulkan {}): {} memory types, {} heaps, {limits:?}, {:?}, enabled {enabled:?}, budgets {budgets:?}",
        properties.name,
        properties.vendor_id,
        properties.device_type,
        properties.api_version_text(),
        properties.memory_types.len(),
        properties.memory_heaps.len(),
        properties.sparse,
    );
    crate::common::finish(Arc::new(context));
}

#[test]
fn lavapipe_reports_sparse_binding() {
    let Some(context) = crate::common::context() else { return };
    let properties = context.properties();
    if !properties.name.contains("llvmpipe") {
        eprintln!("skipped: not lavapipe ({})", properties.name);
        crate::common::finish(Arc::new(context));
        return;
    }
    let enabled = context.enabled_features();
    assert!(enabled.sparse_binding && enabled.sparse_residency_buffer && enabled.sparse_residency_aliased, "{enabled:?}");
    assert!(enabled.timeline_semaphore && enabled.memory_budget, "{enabled:?}");
    assert_eq!(context.sparse_queue_family(), Some(context.compute_queue().0), "lavapipe has one queue family for all");
    assert!(properties.limits.sparse_address_space_size_bytes > 0);
    // Mesa 25's lavapipe is a Vulkan 1.4 device: maxBufferSize is reported.
    assert!(properties.limits.max_buffer_size_bytes.is_some_and(|bytes| bytes >= 1 << 30), "{:?}", properties.limits);
    assert!(properties.memory_types.iter().all(|t| t.property_flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE)));
    crate::common::finish(Arc::new(context));
}
