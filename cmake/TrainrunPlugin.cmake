# trainrun_add_plugin(<name> <sources>...)
# Builds a trainrun plugin: a shared module lib<name>.so linked with the SDK,
# hidden symbols except the plugin descriptor.
function(trainrun_add_plugin name)
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE trainrun::sdk)
  set_target_properties(${name} PROPERTIES
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    PREFIX "lib")
endfunction()
