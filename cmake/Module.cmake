# pagoda_add_module(NAME <name> SOURCES ... DEPS ... [EXTERNAL ...])
# Declares the one static library of a module: pagoda_<name>. DEPS are other pagoda modules
# (linked PUBLIC: layering points down only); EXTERNAL are third-party targets.
function(pagoda_add_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;DEPS;EXTERNAL;PRIVATE_EXTERNAL" ${ARGN})
  set(target pagoda_${M_NAME})
  if(M_SOURCES)
    add_library(${target} STATIC ${M_SOURCES})
    target_include_directories(${target} PUBLIC ${PAGODA_MODULE_ROOT})
    target_link_libraries(${target} PUBLIC ${M_DEPS} ${M_EXTERNAL}
                                    PRIVATE pagoda_warnings ${M_PRIVATE_EXTERNAL})
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${PAGODA_MODULE_ROOT})
    target_link_libraries(${target} INTERFACE ${M_DEPS} ${M_EXTERNAL})
  endif()
endfunction()

# pagoda_add_test(NAME <name> SOURCES ... DEPS ... [LABELS ...])
# One GoogleTest executable registered with CTest through gtest_discover_tests, with the shared
# test helpers (pagoda_test_support: tests/support).
include(GoogleTest)
function(pagoda_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} pagoda_test_support GTest::gtest
                                          GTest::gtest_main pagoda_warnings)
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${T_LABELS}")
endfunction()
